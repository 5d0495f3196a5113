"""The software power readers themselves (not only the shared ChannelTracker) through synthetic
sysfs trees and a fake `vcgencmd`: a RAPL counter wrapping at `max_energy_range_uj`, a RAPL
zone without that file (a decrease is then "backwards", never a wrap), a frozen RAPL counter, an
hwmon attribute file vanishing mid-run, and the PMIC's permission denied."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from meter.sources.common import SourceError
from meter.sources.hwmon import HwmonSource
from meter.sources.pmic import PmicSource, run_command
from meter.sources.rapl import RaplSource
from meter.sources.recorder import SourcePoller
from tests.meter.sources_fakes import (
    PMIC_SAMPLE,
    PMIC_SAMPLE_W,
    ListWriter,
    StepClock,
    hwmon_tree,
    rapl_tree,
    set_uj,
)

PKG = "intel-rapl:0"
DRAM = "intel-rapl:0:1"


def _poller(src, clock: StepClock, **kw) -> tuple[SourcePoller, ListWriter]:
    poller = SourcePoller(src, 0, clock, **kw)
    writer = ListWriter()
    poller.start_without_thread(writer)
    return poller, writer


def _steps(tmp_path: Path, poller: SourcePoller, clock: StepClock, pkg_uj: list[int],
           dt_s: float = 0.1) -> None:
    """Poll once per value: advance the clock, set the package counter, read."""
    for uj in pkg_uj:
        clock.advance(dt_s)
        set_uj(tmp_path, PKG, uj)
        poller.poll_once()


def test_rapl_reader_wraps_at_max_energy_range_uj(tmp_path: Path) -> None:
    rapl_tree(tmp_path, package_uj=9_000_000, max_range_uj=10_000_000)  # a 10 J range
    src = RaplSource(tmp_path)
    assert src.channels()[0].max_range_j == pytest.approx(10.0)
    clock = StepClock()
    poller, writer = _poller(src, clock)
    poller.poll_once()  # the baseline
    # 9.5 J, then 0.5 J: the counter passed 10 J and restarted (1.0 J in 0.1 s = 10 W)
    _steps(tmp_path, poller, clock, [9_500_000, 500_000, 1_000_000])
    pkg = [r for r in writer.rows if r[1] == 0]
    assert [r[9] for r in pkg] == pytest.approx([0.5, 1.5, 2.0])  # the energy continues
    assert [r[4] for r in pkg] == pytest.approx([5.0, 10.0, 5.0])
    wraps = [e for e in writer.events if e[3] == "counter_wrap"]
    assert len(wraps) == 1 and wraps[0][2] == 0 and "range 10 J" in wraps[0][4]
    assert not [e for e in writer.events if e[3] in ("counter_backwards", "gap")]
    assert poller.measured()["0"]["wraps"] == 1


def test_rapl_zone_without_max_energy_range_uj_goes_backwards_not_wrap(tmp_path: Path) -> None:
    rapl_tree(tmp_path, package_uj=9_000_000, max_range_uj=10_000_000)
    (tmp_path / "sys/class/powercap" / PKG / "max_energy_range_uj").unlink()
    src = RaplSource(tmp_path)
    assert src.channels()[0].max_range_j is None  # unknown range
    clock = StepClock()
    poller, writer = _poller(src, clock)
    poller.poll_once()
    _steps(tmp_path, poller, clock, [9_500_000, 500_000, 1_000_000])
    pkg = [r for r in writer.rows if r[1] == 0]
    # the decrease is not counted: 0.5 J before it, +0.5 J after it
    assert [r[9] for r in pkg] == pytest.approx([0.5, 1.0])
    kinds = [e[3] for e in writer.events if e[2] == 0]
    assert kinds == ["counter_backwards", "gap"]


def test_rapl_reader_frozen_counter_is_an_event_no_rows_then_a_gap(tmp_path: Path) -> None:
    rapl_tree(tmp_path, package_uj=0, dram_uj=0)
    src = RaplSource(tmp_path)
    clock = StepClock()
    poller, writer = _poller(src, clock)  # the default: frozen after 5 s unchanged
    poller.poll_once()
    _steps(tmp_path, poller, clock, [100_000, 200_000])  # 1 W
    n_rows = len([r for r in writer.rows if r[1] == 0])
    _steps(tmp_path, poller, clock, [200_000] * 60)  # stuck for 6 s
    frozen = [e for e in writer.events if e[3] == "counter_frozen" and e[2] == 0]
    assert len(frozen) == 1 and "unchanged for" in frozen[0][4] and "fix:" in frozen[0][4]
    assert len([r for r in writer.rows if r[1] == 0]) == n_rows  # no rows, never 0 W
    _steps(tmp_path, poller, clock, [300_000, 400_000])  # moves again
    gaps = [e for e in writer.events if e[3] == "gap" and e[2] == 0]
    assert len(gaps) == 1 and "counter frozen for" in gaps[0][4]
    pkg = [r for r in writer.rows if r[1] == 0]
    assert all(r[4] > 0 for r in pkg)
    assert poller.measured()["0"]["frozen"] == 1


def test_hwmon_file_missing_mid_run_is_an_event_then_a_gap(tmp_path: Path) -> None:
    hwmon_tree(tmp_path)
    src = HwmonSource(tmp_path)
    names = [c.name for c in src.channels()]
    gpu = names.index("hwmon:hwmon0:amdgpu:PPT")
    energy = names.index("hwmon:hwmon1:amd_energy:Esocket0")
    clock = StepClock()
    poller, writer = _poller(src, clock)
    power_file = tmp_path / "sys/class/hwmon/hwmon0/power1_input"
    energy_file = tmp_path / "sys/class/hwmon/hwmon1/energy1_input"
    poller.poll_once()
    uj = 7_000_000
    for k in range(6):
        clock.advance(0.25)
        uj += 2_500_000  # 10 W
        energy_file.write_text(f"{uj}\n")
        if k == 2:
            power_file.unlink()  # the GPU driver unloaded
        if k == 4:
            power_file.write_text("17000000\n")  # back
        poller.poll_once()
    err = [e for e in writer.events if e[2] == gpu and e[3] == "read_error"]
    assert len(err) == 1 and "power1_input: missing" in err[0][4] and "fix:" in err[0][4]
    gaps = [e for e in writer.events if e[2] == gpu and e[3] == "gap"]
    assert len(gaps) == 1 and "data resumed after read_error ×2" in gaps[0][4]
    gpu_rows = [r for r in writer.rows if r[1] == gpu]
    assert all(r[4] > 0 for r in gpu_rows)  # never a 0 W row for the missing file
    assert [r[4] for r in gpu_rows] == pytest.approx([16.0, 16.0, 16.0, 17.0, 17.0])
    # no energy is integrated across the failure: only 16 W × 0.5 s before, 17 W × 0.25 s after
    assert gpu_rows[3][9] == pytest.approx(gpu_rows[2][9]) == pytest.approx(8.0)
    assert gpu_rows[4][9] == pytest.approx(8.0 + 17.0 * 0.25)
    # the other channel of the same source kept going
    assert [r[4] for r in writer.rows if r[1] == energy] == pytest.approx([10.0] * 6)
    assert not [e for e in writer.events if e[2] == energy]


def _fake_vcgencmd(bin_dir: Path, *, ok_runs: int) -> Path:
    """A `vcgencmd` that answers `ok_runs` times, then fails as a user outside the video
    group does (`/dev/vcio` not readable), counting its runs in a file beside it."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "vcgencmd"
    sample = bin_dir / "sample.txt"
    sample.write_text(PMIC_SAMPLE)
    script.write_text(f"""#!/bin/sh
n=$(cat "{bin_dir}/runs" 2>/dev/null || echo 0)
n=$((n + 1))
echo $n > "{bin_dir}/runs"
if [ $n -le {ok_runs} ]; then cat "{sample}"; exit 0; fi
echo "failed to open vcio device: Permission denied" >&2
exit 1
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script


def test_pmic_permission_denied_at_start_is_an_error_with_the_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_vcgencmd(tmp_path / "bin", ok_runs=0)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(SourceError) as info:
        PmicSource()  # the real runner: runs vcgencmd from PATH
    assert info.value.kind == "permission_denied"
    line = info.value.line()
    assert "Permission denied" in line and "adduser $USER video" in line


def test_pmic_permission_denied_mid_run_is_an_event_never_zero(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_vcgencmd(tmp_path / "bin", ok_runs=3)  # the probe at start + two readings
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    src = PmicSource(run_command)
    clock = StepClock()
    poller, writer = _poller(src, clock)
    for _ in range(5):
        poller.poll_once()
        clock.advance(0.5)
    rows = [r for r in writer.rows if r[1] == 0]
    assert [r[4] for r in rows] == pytest.approx([PMIC_SAMPLE_W] * 2)  # no row once denied
    denied = [e for e in writer.events if e[3] == "permission_denied"]
    assert len(denied) == 1 and "adduser $USER video" in denied[0][4]
    poller.stop()  # stopping while it fails closes the failure with a gap
    gaps = [e for e in writer.events if e[3] == "gap"]
    assert len(gaps) == 1 and "stopped while failing: permission_denied ×3" in gaps[0][4]
