"""Software power sources against synthetic sysfs trees, a fake NVML library and fake vcgencmd:
channel discovery, wrap, backwards, freeze, a missing file, permission denied."""

from __future__ import annotations

import itertools
import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epi.core.errors import UserError
from epi.formats.trace import EventKind
from meter.sources.common import ChannelSpec, NullSource, SourceError
from meter.sources.counters import ChannelTracker
from meter.sources.factory import SourceEnv, open_sources, parse_spec, probe_sources
from meter.sources.hwmon import HwmonSource
from meter.sources.nvml import NvmlBinding, NvmlSource
from meter.sources.pmic import PmicSource, parse_rails
from meter.sources.rapl import RaplSource
from meter.sources.recorder import SourcePoller
from tests.meter.sources_fakes import (
    PMIC_SAMPLE,
    PMIC_SAMPLE_W,
    FakeNvmlLib,
    ListWriter,
    StepClock,
    hwmon_tree,
    rapl_tree,
    set_uj,
)


def deny(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Make reads of files called `name` fail with EACCES, as for a non-root user (the tests
    run as root in CI containers, where chmod does not deny)."""
    real = pathlib.Path.read_text

    def read_text(self: pathlib.Path, *a: object, **k: object) -> str:
        if self.name == name:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(pathlib.Path, "read_text", read_text)


# ------------------------------------------------------------------------------------ RAPL
def test_rapl_finds_package_and_dram_not_core_uncore_or_mmio(tmp_path: pathlib.Path) -> None:
    rapl_tree(tmp_path, psys=True)
    src = RaplSource(tmp_path)
    chans = src.channels()
    assert [(c.name, c.scope) for c in chans] == [
        ("rapl:package-0", "package"), ("rapl:dram-0", "dram"), ("rapl:psys-1", "platform")]
    assert all(c.counter == "energy" and c.resolution_j == 1e-6 for c in chans)
    assert chans[0].max_range_j == pytest.approx(262_143.328850)
    assert src.read() == [pytest.approx(1.0), pytest.approx(0.5), pytest.approx(42e-6)]


def test_rapl_absent_is_an_error_with_a_fix(tmp_path: pathlib.Path) -> None:
    with pytest.raises(SourceError) as info:
        RaplSource(tmp_path)
    assert "modprobe" in info.value.line()


def test_rapl_permission_denied_names_the_file_and_the_fix(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rapl_tree(tmp_path)
    deny(monkeypatch, "energy_uj")
    with pytest.raises(SourceError) as info:
        RaplSource(tmp_path)
    assert info.value.kind == "permission_denied"
    line = info.value.line()
    assert "energy_uj: permission denied" in line and "chmod o+r" in line and "root" in line
    # explicit --source rapl: one-line UserError; auto: left out with the reason logged
    with pytest.raises(UserError, match=r"--source rapl: .*permission denied.*fix: "):
        open_sources("rapl", SourceEnv(sysfs_root=tmp_path))
    logged: list[str] = []
    env = SourceEnv(sysfs_root=tmp_path, pmic_runner=_no_pmic, nvml=_no_nvml)
    got = open_sources("auto", env, log=logged.append)
    assert [type(s) for s in got] == [NullSource]
    assert any("source rapl left out" in m and "chmod" in m for m in logged)


def _no_pmic(argv: object) -> str:
    raise SourceError(EventKind.READ_ERROR, "vcgencmd: not found", "not a Pi")


def _no_nvml() -> NvmlBinding:
    raise SourceError(EventKind.READ_ERROR, "NVML: cannot load libnvidia-ml.so.1",
                      "install a driver")


def test_rapl_missing_file_mid_run_is_an_event_then_a_gap(tmp_path: pathlib.Path) -> None:
    rapl_tree(tmp_path)
    src = RaplSource(tmp_path)
    clock, writer = StepClock(), ListWriter()
    poller = SourcePoller(src, 4, clock)
    poller.start_without_thread(writer)
    poller.poll_once()
    clock.advance(0.1)
    set_uj(tmp_path, "intel-rapl:0", 2_000_000)
    set_uj(tmp_path, "intel-rapl:0:1", 600_000)
    assert poller.poll_once() == 2
    (tmp_path / "sys/class/powercap/intel-rapl:0/energy_uj").unlink()
    clock.advance(0.1)
    set_uj(tmp_path, "intel-rapl:0:1", 700_000)
    poller.poll_once()
    errors = [e for e in writer.events if e[3] == "read_error"]
    assert len(errors) == 1 and errors[0][2] == 4 and "missing" in errors[0][4]
    assert "fix:" in errors[0][4]
    clock.advance(0.1)
    set_uj(tmp_path, "intel-rapl:0", 3_000_000)
    set_uj(tmp_path, "intel-rapl:0:1", 800_000)
    poller.poll_once()
    gaps = [e for e in writer.events if e[3] == "gap" and e[2] == 4]
    assert len(gaps) == 1 and "data resumed after read_error ×1" in gaps[0][4]
    # no row was written for channel 4 while it failed, and never a 0 W row
    ch4 = [r for r in writer.rows if r[1] == 4]
    assert all(r[4] > 0 for r in ch4)
    assert len(ch4) == 1  # the step spanning the failure is not trusted


def test_rapl_power_from_a_counter_advancing_at_a_known_power(tmp_path: pathlib.Path) -> None:
    rapl_tree(tmp_path, package_uj=0, dram_uj=0)
    src = RaplSource(tmp_path)
    clock, writer = StepClock(), ListWriter()
    poller = SourcePoller(src, 0, clock)
    poller.start_without_thread(writer)
    watts = (35.0, 4.0)
    for k in range(1, 21):
        poller.poll_once()
        clock.advance(0.05)
        set_uj(tmp_path, "intel-rapl:0", round(watts[0] * 0.05 * k * 1e6))
        set_uj(tmp_path, "intel-rapl:0:1", round(watts[1] * 0.05 * k * 1e6))
    poller.poll_once()
    for ch, w in enumerate(watts):
        rows = [r for r in writer.rows if r[1] == ch]
        assert len(rows) == 20
        assert all(r[4] == pytest.approx(w, rel=1e-6) for r in rows)
        assert rows[-1][9] == pytest.approx(w * 1.0, rel=1e-6)
        assert [r[0] for r in rows] == list(range(20))  # per-channel seq
    m = poller.measured()["0"]
    assert m["update_interval_s_measured"] == pytest.approx(0.05)
    assert m["smallest_step_measured"] == pytest.approx(35.0 * 0.05)


# ------------------------------------------------------------------------ counter rules
def spec(counter: str = "energy", max_range_j: float | None = None) -> ChannelSpec:
    return ChannelSpec("rapl", "rapl:test", "package", counter, 1e-6, None, "test",
                       max_range_j=max_range_j)


def run_tracker(tr: ChannelTracker, values: list[float], dt_s: float = 0.1
                ) -> list[tuple[int, int, float, float]]:
    rows = []
    t = 1_000_000_000
    for v in values:
        row = tr.feed(t, t + 5, v)
        if row is not None:
            rows.append(row)
        t += round(dt_s * 1e9)
    return rows


def test_wrap_continues_the_energy_and_is_an_event() -> None:
    events: list[tuple] = []
    tr = ChannelTracker(spec(max_range_j=100.0), lambda *e: events.append(e))
    rows = run_tracker(tr, [90.0, 95.0, 99.0, 3.0, 8.0])
    assert [r[3] for r in rows] == pytest.approx([5.0, 9.0, 13.0, 18.0])
    assert [r[2] for r in rows] == pytest.approx([50.0, 40.0, 40.0, 50.0])
    assert [e[2] for e in events] == ["counter_wrap"]
    assert tr.stats.wraps == 1


def test_backwards_without_range_is_an_event_and_a_gap_not_counted() -> None:
    events: list[tuple] = []
    tr = ChannelTracker(spec(max_range_j=None), lambda *e: events.append(e))
    rows = run_tracker(tr, [50.0, 55.0, 2.0, 7.0])
    assert [r[3] for r in rows] == pytest.approx([5.0, 10.0])
    assert [e[2] for e in events] == ["counter_backwards", "gap"]
    assert events[1][3].startswith("end_mono_ns=")


def test_implausible_wrap_counts_as_backwards() -> None:
    events: list[tuple] = []
    # range 1e9 J: wrapping within 0.1 s would mean 10 GW
    tr = ChannelTracker(spec(max_range_j=1e9), lambda *e: events.append(e))
    run_tracker(tr, [500.0, 10.0])
    assert [e[2] for e in events] == ["counter_backwards", "gap"]


def test_frozen_counter_is_an_event_no_rows_then_a_gap() -> None:
    events: list[tuple] = []
    tr = ChannelTracker(spec(), lambda *e: events.append(e), freeze_after_s=1.0)
    rows = run_tracker(tr, [1.0, 2.0] + [2.0] * 30 + [5.0, 6.0])
    assert [e[2] for e in events] == ["counter_frozen", "gap"]
    assert "frozen for" in events[1][3]
    assert all(r[2] > 0 for r in rows)  # never a zero-power row for "no update"
    assert tr.stats.frozen == 1


def test_power_reading_integrates_by_trapezoid_and_freezes() -> None:
    events: list[tuple] = []
    tr = ChannelTracker(spec("power"), lambda *e: events.append(e), freeze_after_s=10.0)
    rows = run_tracker(tr, [10.0, 20.0, 30.0], dt_s=1.0)
    assert [r[3] for r in rows] == pytest.approx([0.0, 15.0, 40.0])
    assert not events


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 400), min_size=1, max_size=60), st.integers(0, 999))
def test_wrapping_counter_energy_equals_sum_of_steps(steps: list[int], start: int) -> None:
    """Any sequence of increments under a 1000 J range is recovered exactly, wraps or not."""
    rng = 1000
    raw, values = start, [float(start)]
    for s in steps:
        raw = (raw + s) % rng
        values.append(float(raw))
    tr = ChannelTracker(spec(max_range_j=float(rng)), lambda *e: None)
    rows = run_tracker(tr, values, dt_s=1.0)
    assert rows[-1][3] == pytest.approx(float(sum(steps)))
    assert tr.stats.wraps == sum(1 for a, b in itertools.pairwise(values) if b < a)


# ----------------------------------------------------------------------------- hwmon
def test_hwmon_channels_prefer_energy_then_input(tmp_path: pathlib.Path) -> None:
    hwmon_tree(tmp_path)
    src = HwmonSource(tmp_path)
    chans = src.channels()
    assert [(c.name, c.scope, c.counter) for c in chans] == [
        ("hwmon:hwmon0:amdgpu:PPT", "gpu", "power"),
        ("hwmon:hwmon1:amd_energy:Esocket0", "package", "energy")]
    assert src.read() == [pytest.approx(16.0), pytest.approx(7.0)]
    assert src.min_interval_s == pytest.approx(0.25)  # the driver's update_interval


def test_hwmon_permission_denied(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
                                 ) -> None:
    hwmon_tree(tmp_path)
    deny(monkeypatch, "power1_input")
    with pytest.raises(SourceError, match="power1_input: permission denied") as info:
        HwmonSource(tmp_path)
    assert "chmod o+r" in info.value.line()


# ------------------------------------------------------------------------------ NVML
def test_nvml_energy_counter_per_gpu_and_power_fallback() -> None:
    lib = FakeNvmlLib(energy_mj=[5_000, None], power_mw=[300_000, 70_500])
    src = NvmlSource(NvmlBinding(lib))
    chans = src.channels()
    assert [(c.name, c.counter, c.scope) for c in chans] == [
        ("nvml:gpu0", "energy", "gpu"), ("nvml:gpu1", "power", "gpu")]
    assert chans[0].extra["device"] == "Fake GPU 0"
    assert src.read() == [pytest.approx(5.0), pytest.approx(70.5)]


def test_nvml_permission_and_lost_gpu() -> None:
    with pytest.raises(SourceError, match="Insufficient Permissions") as info:
        NvmlSource(NvmlBinding(FakeNvmlLib([1], [1], init_code=4)))
    assert info.value.kind == "permission_denied"
    lib = FakeNvmlLib(energy_mj=[1_000], power_mw=[1])
    src = NvmlSource(NvmlBinding(lib))
    lib.fail_code[0] = 15
    (err,) = src.read()
    assert isinstance(err, SourceError) and "GPU is lost" in err.line()
    assert "reset" in err.fix


def test_nvml_poller_never_polls_faster_than_100ms() -> None:
    lib = FakeNvmlLib(energy_mj=[0], power_mw=[1])
    poller = SourcePoller(NvmlSource(NvmlBinding(lib)), 0, StepClock(), interval_s=0.001)
    assert poller.interval_s == pytest.approx(0.1)


def test_poller_slows_to_the_measured_update_interval(tmp_path: pathlib.Path) -> None:
    """A counter that changes every 0.5 s, polled every 0.05 s: the poller slows to 0.5 s."""
    rapl_tree(tmp_path, package_uj=0, dram_uj=0)
    clock, writer = StepClock(), ListWriter()
    poller = SourcePoller(RaplSource(tmp_path), 0, clock)
    poller.start_without_thread(writer)
    for k in range(64):
        if k % 10 == 0:
            set_uj(tmp_path, "intel-rapl:0", k * 1000)
            set_uj(tmp_path, "intel-rapl:0:1", k * 1000)
        poller.poll_once()
        poller._adapt()
        clock.advance(0.05)
    assert poller.interval_s == pytest.approx(0.5)


# ------------------------------------------------------------------------------ PMIC
def test_pmic_sums_rails_with_both_readings() -> None:
    assert sum(parse_rails(PMIC_SAMPLE).values()) == pytest.approx(PMIC_SAMPLE_W)
    argv_seen: list[list[str]] = []

    def runner(argv: list[str]) -> str:
        argv_seen.append(list(argv))
        return PMIC_SAMPLE

    src = PmicSource(runner)
    (chan,) = src.channels()
    assert chan.scope == "board_rails" and "NOT the wall" in chan.measures
    assert src.read() == [pytest.approx(PMIC_SAMPLE_W)]
    assert argv_seen[0] == ["vcgencmd", "pmic_read_adc"]  # an argv list, no shell


def test_pmic_rail_missing_is_an_error() -> None:
    outputs = iter([PMIC_SAMPLE, "\n".join(PMIC_SAMPLE.splitlines()[1:])])
    src = PmicSource(lambda argv: next(outputs))
    (err,) = src.read()
    assert isinstance(err, SourceError) and "3V7_WL_SW missing" in err.line()


# --------------------------------------------------------------------- factory, doctor
def test_spec_parsing() -> None:
    assert parse_spec("auto")[1] is True
    assert parse_spec("rapl, nvml,rapl") == (["rapl", "nvml"], False)
    with pytest.raises(UserError, match="unknown source 'ipmi'"):
        parse_spec("rapl,ipmi")


def test_probe_says_which_are_readable(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
                                       ) -> None:
    rapl_tree(tmp_path)
    hwmon_tree(tmp_path)
    deny(monkeypatch, "power1_input")
    env = SourceEnv(sysfs_root=tmp_path, nvml=lambda: NvmlBinding(FakeNvmlLib([1], [1])),
                    pmic_runner=lambda argv: PMIC_SAMPLE)
    got = {p.source: (p.present, p.readable) for p in probe_sources(env)}
    assert got == {"rapl": (True, True), "hwmon": (True, False), "nvml": (True, True),
                   "pmic": (True, True)}


def test_doctor_says_which_counters_are_readable(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from host.doctor import _power_counter_checks
    from meter.sources.common import SYSFS_ROOT_ENV

    rapl_tree(tmp_path)
    hwmon_tree(tmp_path)
    monkeypatch.setenv(SYSFS_ROOT_ENV, str(tmp_path))
    deny(monkeypatch, "energy_uj")
    got = {c.item.split()[0]: c for c in _power_counter_checks()}
    assert got["rapl"].ok is False and "chmod o+r" in got["rapl"].fix
    assert got["hwmon"].ok is True and "amdgpu" in got["hwmon"].detail


# ------------------------------------------------------------- hostile inputs (readers)
@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_pmic_parser_takes_any_text(text: str) -> None:
    rails = parse_rails(text)
    assert all(isinstance(v, float) for v in rails.values())


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_sysfs_number_is_an_int_or_a_source_error(tmp_path_factory, data: bytes) -> None:
    from meter.sources.common import read_sysfs_number

    path = tmp_path_factory.mktemp("attr") / "energy_uj"
    path.write_bytes(data)
    try:
        value = read_sysfs_number(path)
    except SourceError as err:
        assert err.kind == "read_error" and str(path) in err.line()
    else:
        assert value == int(data.decode().strip())


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["scope", "source", "resolution_j", "sample_period_s",
                                        "counter", "wall"]),
                       st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                                 st.text(max_size=8)), max_size=6))
def test_trace_reader_checks_any_source_channel_keys(keys: dict) -> None:
    """Hostile software-channel keys: a valid channel entry, or one line naming the field."""
    from epi.formats.trace import check_meta

    meta = {"format": "epi-trace", "format_version": 1, "segment": 0,
            "channels": [{"channel": 0, "name": "x", **keys}]}
    try:
        info = check_meta(pathlib.Path("meta.json"), meta, 0)[0]
    except UserError as err:
        line = str(err)
        assert "\n" not in line and line.startswith("meta.json: field channels[0].")
        return
    assert isinstance(info.scope, str)
    assert info.resolution_j is None or info.resolution_j > 0
    assert info.sample_period_s is None or 0 < info.sample_period_s <= 3600
    assert info.source is None or info.source in {"rapl", "hwmon", "nvml", "pmic"}


def test_a_steady_power_reading_is_not_frozen_before_30_s() -> None:
    events: list[tuple] = []
    tr = ChannelTracker(spec("power"), lambda *e: events.append(e))
    rows = run_tracker(tr, [12.0] * 320, dt_s=0.1)  # 32 s of one value: a coarse sensor
    assert [e[2] for e in events] == ["counter_frozen"]
    frozen_after_s = (events[0][0] - 1_000_000_000) / 1e9
    assert 30.0 < frozen_after_s <= 30.2
    assert len(rows) == 301  # every reading up to the freeze (t = 0 … 30.0 s) is a row
