"""/metrics passes Prometheus's own lint (`promtool check metrics`): it exited 3 on every
scrape because `epi_meter_status_bits` reads as a unit ("use base unit bytes instead of
bits"). The naming rules are also checked here directly (promtool is not always installed):
no name part is a non-base unit or a scaled one, counters end in `_total` and only counters
do. And every dashboard series exists from the first scrape after the first samples, the fault
counter at 0 for every counted kind: a series that appears only at its first fault shows "no
data" on its panel, and increase() misses that first fault."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from meter.daemon.metrics import COUNTED_FAULT_KINDS
from meter.daemon.service import DaemonOptions, MeterDaemon

DASHBOARD = Path(__file__).resolve().parents[2] / "hardware" / "grafana" / "dashboards" / \
    "epi-meter.json"
# promtool's lint (client_golang promlint): units that are not base units, and unit prefixes
NON_BASE_UNITS = {"bits", "minutes", "hours", "days", "weeks", "kelvins", "fahrenheit",
                  "rankine", "inches", "yards", "miles", "calories", "pounds", "ounces"}
PREFIXES = ("exa", "peta", "tera", "giga", "mega", "kilo", "hecto", "deca", "deci", "centi",
            "milli", "micro", "nano", "pico", "femto", "atto")
BASE_UNITS = ("amperes", "bytes", "celsius", "grams", "joules", "kelvin", "meters", "metres",
              "seconds", "volts")


def _first_scrape(tmp_path: Path, bridge: bool) -> str:
    """/metrics of an emulated daemon right after every channel's first sample, before any
    fault."""
    opts = DaemonOptions(out_dir=tmp_path / "t", emulate=not bridge, emulate_bridge=bridge,
                         listen="127.0.0.1:0", n_emulated_channels=2)
    daemon = MeterDaemon(opts, log=lambda _line: None)
    thread = threading.Thread(target=daemon.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        def sampled() -> bool:
            if daemon.session is None or daemon.server is None:
                return False
            snap = daemon.session.state.snapshot()["channels"]
            return isinstance(snap, list) and all(c["samples_total"] >= 1 for c in snap)

        while not sampled():
            assert time.monotonic() < deadline, "no sweep in 30 s"
            time.sleep(0.01)
        with urllib.request.urlopen(daemon.server.url + "/metrics", timeout=10) as resp:
            return resp.read().decode()  # type: ignore[no-any-return]
    finally:
        daemon.stop()
        thread.join(30)


@pytest.fixture(scope="module", params=["direct", "bridge"])
def scrape(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> tuple[str, str]:
    return request.param, _first_scrape(tmp_path_factory.mktemp("m"), request.param == "bridge")


def naming_problems(text: str) -> list[str]:
    """promtool's naming rules, applied to every family of an exposition."""
    out = []
    for fam in text_string_to_metric_families(text):
        raw = [ln.split()[3] for ln in text.splitlines()
               if ln.startswith(f"# TYPE {fam.name}")]
        kind = raw[0] if raw else fam.type
        name = fam.name + ("_total" if kind == "counter" and not fam.name.endswith("_total")
                           else "")
        for part in name.split("_"):
            if part in NON_BASE_UNITS:
                out.append(f"{name}: non-base unit {part!r}")
            for p in PREFIXES:
                if part.startswith(p) and part[len(p):] in BASE_UNITS:
                    out.append(f"{name}: scaled unit {part!r}")
        if kind == "counter" and not name.endswith("_total"):
            out.append(f"{name}: a counter without _total")
        if kind != "counter" and name.endswith("_total"):
            out.append(f"{name}: _total on a {kind}")
    return out


def test_the_naming_rule_catches_a_unit_part() -> None:
    text = ("# HELP epi_meter_status_bits x\n# TYPE epi_meter_status_bits gauge\n"
            "epi_meter_status_bits 1\n# HELP a_milliseconds x\n# TYPE a_milliseconds gauge\n"
            "a_milliseconds 1\n")
    assert naming_problems(text) == ["epi_meter_status_bits: non-base unit 'bits'",
                                     "a_milliseconds: scaled unit 'milliseconds'"]


def test_metrics_follow_the_naming_rules(scrape: tuple[str, str]) -> None:
    _, text = scrape
    assert naming_problems(text) == []


# on PATH, or where `make test` puts it (scripts/setup_promtool.sh)
PROMTOOL = shutil.which("promtool") or shutil.which(
    "promtool", path=str(Path(__file__).resolve().parents[2] / ".fwtools" / "bin"))


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (`make test` fetches it: "
                    "scripts/setup_promtool.sh); the rules are checked above")
def test_promtool_check_metrics_passes(scrape: tuple[str, str]) -> None:
    _, text = scrape
    assert PROMTOOL is not None
    run = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_fault_counter_exists_from_the_first_scrape(scrape: tuple[str, str]) -> None:
    _, text = scrape
    found = {(s.labels["channel"], s.labels["kind"]): s.value
             for f in text_string_to_metric_families(text) for s in f.samples
             if s.name == "epi_meter_faults_total"}
    for ch in ("0", "1"):
        for kind in COUNTED_FAULT_KINDS:
            assert found.get((ch, kind)) == 0, (ch, kind, found)


def test_every_dashboard_series_exists_from_the_first_scrape(scrape: tuple[str, str]) -> None:
    path, text = scrape
    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    dash = json.loads(DASHBOARD.read_text())
    queries = json.dumps(dash)
    used = set(re.findall(r"\bepi_meter_[a-z0-9_]+\b", queries))
    # the bridge runs no chain self-check and no sweep schedule of its own (the MCU paces
    # the sweeps): those series are absent there by design, never a made-up 0
    absent_ok = {"epi_meter_chain_disagreement", "epi_meter_chain_disagreement_ratio",
                 "epi_meter_schedule_lateness_seconds", "epi_meter_schedule_lateness_seconds_sum",
                 "epi_meter_schedule_lateness_seconds_count", "epi_meter_sustainable_rate_hertz",
                 } if path == "bridge" else set()
    missing = sorted(used - names - absent_ok)
    assert missing == [], missing
