"""`epi run` with several meter daemons: a clock sync with every daemon at the start,
before each repeat and at the end, each offset recorded keyed by its daemon (token-log format
2), in the order given."""

from __future__ import annotations

import json
import time
from pathlib import Path

from host.analysis.tokenlog_reader import read_run
from host.run.runner import RunSettings, meter_urls, run

OFFSETS_NS = {"http://a.test:1": 5_000_000_000, "http://b.test:2": -900_000_000_000}
PROMPTS = {"format": "epi-prompts", "format_version": 1, "name": "test", "version": "test-v1",
           "prompts": [{"id": "p", "n_tokens": 8,
                        "text": "The quick brown fox jumps over the lazy dog."}]}


def test_every_meter_is_synced_and_recorded_by_url(tiny_model: Path, tmp_path: Path) -> None:
    calls: list[str] = []

    def sync(url: str) -> dict[str, object]:  # each daemon its own offset
        calls.append(url)
        return {"t_local_mono_ns": time.monotonic_ns(), "offset_ns": OFFSETS_NS[url],
                "uncertainty_ns": 10, "rtt_ns": 20, "meter_url": "as the daemon says"}

    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(PROMPTS))
    urls = tuple(OFFSETS_NS)
    run(RunSettings(model=tiny_model, out=tmp_path / "log", prompts=prompts, tokens=2,
                    repeats=2, warmups=0, threads=1, idle_s=0, cooldown_s=0, meters=urls),
        echo=lambda line: None, clock_sync=sync)
    assert calls == list(urls) * 3  # start, before repeat 2, end
    log = read_run(tmp_path / "log")
    assert log.header["format_version"] == 2 and log.header["meters"] == list(urls)
    got = [(e["when"], e["meter_url"], e["offset_ns"]) for e in log.clock_sync]
    assert got == [(w, u, OFFSETS_NS[u]) for w in ("start", "during", "end") for u in urls]
    assert log.header["clock_drift_ppm"] == 0.0  # meter a's own offsets: constant


def test_meter_and_meters_join_in_order_once() -> None:
    s = RunSettings(model=Path("m.gguf"), out=Path("o"), meter="http://a:1",
                    meters=("http://b:2", "http://a:1"))
    assert meter_urls(s) == ["http://a:1", "http://b:2"]
    assert meter_urls(RunSettings(model=Path("m.gguf"), out=Path("o"))) == []
