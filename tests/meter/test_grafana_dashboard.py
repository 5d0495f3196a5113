"""The Grafana dashboard shipped in hardware/grafana/ (docs/daemon.md): every panel's query
names a metric that a running emulated daemon exports — scraped from its /metrics, not taken
from a list in the code — and the provisioning files point the panels at their datasource."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from meter.daemon.service import DaemonOptions, MeterDaemon

GRAFANA = Path(__file__).resolve().parents[2] / "hardware" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "epi-meter.json"
METRIC = re.compile(r"\bepi_meter_[a-z0-9_]+\b")


def _panels(items: list[dict]) -> list[dict]:
    out = []
    for p in items:
        out.append(p)
        out += _panels(p.get("panels") or [])
    return out


def _queries(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, query) of every panel target and template variable."""
    qs = [(p["title"], t["expr"]) for p in _panels(dashboard["panels"])
          for t in p.get("targets") or []]
    for var in dashboard.get("templating", {}).get("list", []):
        q = var.get("query")
        qs.append((f"variable {var['name']}", q["query"] if isinstance(q, dict) else q))
    return qs


def _scrape(url: str) -> set[str]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        fams = text_string_to_metric_families(resp.read().decode())
        return {s.name for f in fams for s in f.samples}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """Sample names a running emulated daemon exports, once a fault (a checksum error
    injected at 0.3 s) has been counted, so the fault counter has samples too."""
    opts = DaemonOptions(out_dir=tmp_path_factory.mktemp("trace"), emulate=True,
                         listen="127.0.0.1:0", rate_hz=20, duration_s=60,
                         faults=["checksum:1@0.3"])
    daemon = MeterDaemon(opts, log=lambda _line: None)
    thread = threading.Thread(target=daemon.run)
    thread.start()
    try:
        assert daemon.ready.wait(30)
        url = daemon.server.url  # type: ignore[union-attr]  # listen is set: a server runs
        names: set[str] = set()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            names = _scrape(url)
            if "epi_meter_faults_total" in names and "epi_meter_sustainable_rate_hertz" in names:
                break
            time.sleep(0.2)
        return names
    finally:
        daemon.stop()
        thread.join(30)


def test_every_panel_query_names_an_exported_metric(exported: set[str]) -> None:
    dash = json.loads(DASHBOARD.read_text())
    queries = _queries(dash)
    assert len(queries) >= 20
    used = set()
    for title, query in queries:
        names = METRIC.findall(query)
        assert names, f"panel {title!r}: query {query!r} names no epi_meter metric"
        for name in names:
            assert name in exported, f"panel {title!r}: {name} is not exported by the daemon"
        used.update(names)
    # the live view's essentials are on the dashboard
    for name in ("epi_meter_power_watts", "epi_meter_energy_joules_total",
                 "epi_meter_channel_up", "epi_meter_faults_total", "epi_meter_sweeps_total",
                 "epi_meter_clock_realtime_seconds"):
        assert name in used


def test_a_misspelt_metric_would_be_caught(exported: set[str]) -> None:
    """The check can fail: a query naming a metric the daemon does not export."""
    assert "epi_meter_power_watt" not in exported
    assert METRIC.findall("rate(epi_meter_power_watt[1m])") == ["epi_meter_power_watt"]


def test_dashboard_and_provisioning_fit_together() -> None:
    dash = json.loads(DASHBOARD.read_text())
    panels = _panels(dash["panels"])
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)) and dash["uid"] == "epi-meter"
    ds = yaml.safe_load((GRAFANA / "provisioning/datasources/epi-prometheus.yaml").read_text())
    uid = ds["datasources"][0]["uid"]
    assert ds["datasources"][0]["type"] == "prometheus"
    for p in panels:
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == uid and p["title"] and p.get("description")
        assert all(t["datasource"]["uid"] == uid for t in p["targets"])
        assert p["gridPos"]["x"] >= 0 and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
    prov = yaml.safe_load((GRAFANA / "provisioning/dashboards/epi-meter.yaml").read_text())
    assert prov["apiVersion"] == 1 and prov["providers"][0]["type"] == "file"
    scrape = yaml.safe_load((GRAFANA / "prometheus.yml").read_text())
    assert scrape["scrape_configs"][0]["static_configs"][0]["targets"]
