"""A run by hand on the emulated meter: `epi meter run --emulate` in one shell, `epi run
--meter URL` in another, `epi analyze`; the daemon's modelled power follows the run's own
processes because the run registers itself (host/run/meter_follow.py), with nothing exported.

The registration writes a path that a network peer named, so its trust rules are pinned
here one by one; the end-to-end test runs the recipe of docs/runner.md verbatim.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from epi.core.files import read_boot_id
from host.run.meter_follow import FOLLOW_DIR_PREFIX, MeterFollow

REPO = Path(__file__).resolve().parents[2]


def _follow_file(tmp_path: Path) -> Path:
    d = tmp_path / f"{FOLLOW_DIR_PREFIX}x"
    d.mkdir()
    f = d / "follow.pids"
    f.write_text("")
    return f


def _status(path: Path, *, boot: str | None = None) -> dict[str, object]:
    return {"follow_file": str(path), "boot_id": boot or read_boot_id(),
            "power_model_kind": "per_channel"}


def _follow(status: dict[str, object], lines: list[str]) -> MeterFollow:
    return MeterFollow(["http://127.0.0.1:1"], lines.append, pid=4242,
                       read_status=lambda url: status)


def test_a_run_registers_its_pid_and_takes_it_out_at_the_end(tmp_path: Path) -> None:
    f = _follow_file(tmp_path)
    lines: list[str] = []
    follow = _follow(_status(f), lines)
    follow.start()
    assert f.read_text() == "4242\n"
    assert any("follows this run's processes" in line for line in lines)
    follow.stop()
    assert f.read_text() == ""


def test_a_later_run_that_took_over_is_left_alone(tmp_path: Path) -> None:
    f = _follow_file(tmp_path)
    follow = _follow(_status(f), [])
    follow.start()
    f.write_text("777\n")  # another run registered meanwhile
    follow.stop()
    assert f.read_text() == "777\n"


@pytest.mark.parametrize("case", ["other machine", "relative", "wrong name", "wrong dir",
                                  "symlink", "missing", "real meter"])
def test_a_follow_file_that_is_not_the_daemons_own_is_never_written(
        tmp_path: Path, case: str) -> None:
    f = _follow_file(tmp_path)
    target = tmp_path / "precious.txt"
    target.write_text("keep\n")
    status = _status(f)
    if case == "other machine":
        status["boot_id"] = "another-boot"
    elif case == "relative":
        status["follow_file"] = "epi-meter-follow-x/follow.pids"
    elif case == "wrong name":
        status["follow_file"] = str(target)
    elif case == "wrong dir":
        other = tmp_path / "elsewhere"
        other.mkdir()
        (other / "follow.pids").write_text("")
        status["follow_file"] = str(other / "follow.pids")
    elif case == "symlink":
        f.unlink()
        f.symlink_to(target)
    elif case == "missing":
        f.unlink()
    elif case == "real meter":
        status["follow_file"] = None
    lines: list[str] = []
    _follow(status, lines).start()
    assert target.read_text() == "keep\n"
    if case not in ("symlink", "missing", "real meter"):
        assert f.read_text() == ""
    if case == "missing":
        assert not f.exists()  # never created
    if case == "real meter":
        assert lines == []  # a real meter measures the node: nothing to say


def _wait_for_url(log: Path, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = re.search(r"http://127\.0\.0\.1:\d+", log.read_text(errors="replace"))
        if m:
            return m.group(0)
        assert proc.poll() is None, log.read_text()
        time.sleep(0.1)
    raise AssertionError(f"no URL from the daemon: {log.read_text()}")


@pytest.mark.slow
@pytest.mark.shares_cpu  # no timing of it is checked: it may run beside another test
def test_the_hand_run_recipe_gives_valid_figures_or_says_what_to_change(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/runner.md's recipe, verbatim but for paths and a free port: nothing exported."""
    from host.quant.models import prepare_model

    model = prepare_model("smollm2").path
    assert model is not None
    env = {k: v for k, v in os.environ.items()
           if k not in ("EPI_METER_FOLLOW", "EPI_METER_ACTIVITY")}
    log = tmp_path / "daemon.log"
    with log.open("wb") as out:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "epi", "meter", "run", "--emulate", "--out",
             str(tmp_path / "trace"), "--listen", "127.0.0.1:0"],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        url = _wait_for_url(log, daemon)
        run = subprocess.run(
            [sys.executable, "-m", "epi", "run", str(model), "--out", str(tmp_path / "run"),
             "--tokens", "128", "--repeats", "3", "--warmups", "1", "--threads", "1",
             "--idle-s", "2", "--cooldown-s", "0.5",
             "--prompts", str(REPO / "examples" / "prompts-demo-long.json"),
             "--meter", url], cwd=REPO, capture_output=True, text=True, env=env, timeout=900)
        assert run.returncode == 0, run.stderr
        assert "follows this run's processes" in run.stderr, run.stderr
        time.sleep(0.5)  # the last sweeps reach the trace
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)
    analysis = subprocess.run(
        [sys.executable, "-m", "epi", "analyze", str(tmp_path / "run"), "--trace",
         str(tmp_path / "trace"), "--energy-basis", "net", "--out", str(tmp_path / "out")],
        cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
    assert analysis.returncode == 0, analysis.stderr
    text = analysis.stdout
    assert "modelled" in text and "registered run's process tree" in text, text
    if "every run and phase valid" not in text:
        # refused: only for the repeat spread, with what to change on the console
        refused = [line for line in text.splitlines() if "INVALID" in line]
        assert refused and all("repeat CV" in line for line in refused), text
        assert "what to change (repeat spread)" in text, text
