"""`epi meter run` appending to a trace whose earlier segment its own reader refuses says
so on the console before it writes (the new segment goes beside the old; nothing is lost)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "epi", "meter", "run", "--emulate", "--out",
                           str(out), "--duration", "1", "--listen", "off"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)


@pytest.mark.slow
@pytest.mark.shares_cpu  # no timing of it is checked: it may run beside another test
def test_appending_to_a_damaged_trace_warns(tmp_path: Path) -> None:
    out = tmp_path / "trace"
    first = _run(out)
    assert first.returncode == 0, first.stderr
    assert "warning" not in first.stderr
    (meta,) = sorted(out.glob("seg-*.meta.json"))
    doc = json.loads(meta.read_text())
    doc["channels"][0]["meter_constant_imp_per_kwh"] = None  # what a bad MCU hello wrote
    meta.write_text(json.dumps(doc))
    second = _run(out)
    assert second.returncode == 0, second.stderr
    assert "already holds a segment its reader refuses" in second.stderr
    assert meta.name in second.stderr
    assert len(list(out.glob("seg-*.meta.json"))) == 2  # appended beside, nothing lost
