"""The stdlib trace reader's fast paths (epi/formats/trace.py): the per-channel time check on
strided columns (channels alternating, as the daemon writes them) and on any other order,
and each channel's first/last time across segments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epi.core.errors import UserError
from epi.formats.trace import SAMPLE_COLUMNS, read_trace


def _segment(root: Path, n: int, rows: list[tuple[int, int]]) -> None:
    """Segment n with (channel, t_mono_ns) rows in the given order."""
    meta = {"format": "epi-trace", "format_version": 1, "segment": n, "boot_id": "b",
            "sample_period_s": 0.1,
            "channels": [{"channel": c, "name": f"ch{c}", "node": None,
                          "meter_constant_imp_per_kwh": 3200.0} for c in (0, 1)]}
    (root / f"seg-{n:06d}.meta.json").write_text(json.dumps(meta))
    lines = [",".join(SAMPLE_COLUMNS)]
    lines += [f"{i},{ch},{t},{t + 10**18},5.0,230.0,0.02,1.0,50.0,{i}.0,0"
              for i, (ch, t) in enumerate(rows)]
    (root / f"seg-{n:06d}.samples.csv").write_text("\n".join(lines) + "\n")
    (root / f"seg-{n:06d}.events.csv").write_text("t_mono_ns,t_real_ns,channel,kind,detail\n")


# Channel 0 has three rows in a row: not a stride of the column.
IRREGULAR = [(0, 100), (0, 200), (0, 300), (1, 150), (1, 250), (0, 400), (1, 350)]


def test_irregular_channel_order_is_read(tmp_path: Path) -> None:
    _segment(tmp_path, 1, IRREGULAR)
    seg = read_trace(tmp_path).segments[0]
    assert seg.ends == {0: (100, 100 + 10**18, 400, 400 + 10**18),
                        1: (150, 150 + 10**18, 350, 350 + 10**18)}


@pytest.mark.parametrize("rows", [
    [(0, 100), (1, 150), (0, 200), (1, 140), (0, 300), (1, 350)],  # strided, channel 1 back
    [(0, 100), (0, 200), (0, 190), (1, 150), (1, 250), (0, 400), (1, 350)],  # irregular
])
def test_time_going_back_in_one_channel_is_refused(tmp_path: Path, rows) -> None:
    _segment(tmp_path, 1, rows)
    with pytest.raises(UserError, match=r"line 5: .*t_mono_ns is unsorted|line 4: .*unsorted"):
        read_trace(tmp_path)


def test_segments_of_one_boot_overlapping_in_one_channel_are_refused(tmp_path: Path) -> None:
    _segment(tmp_path, 1, IRREGULAR)
    # Channel 1's first time (380) is after its last in segment 1 (350), channel 0's (390)
    # is not after its last (400): only the per-channel ends tell.
    _segment(tmp_path, 2, [(1, 380), (0, 390), (1, 480), (0, 490)])
    with pytest.raises(UserError, match="segment 2 channel 0 t_mono_ns 390 is not after"):
        read_trace(tmp_path)


def test_an_int64_overflow_in_the_final_row_is_named_not_called_truncated(
        synth_run: object) -> None:
    """A complete final line whose time overflows int64 is a wrong value, not a crash cut:
    one line naming the column and the range, never 'dropped a truncated final line'."""
    import pytest as _pytest

    from epi.core.errors import UserError
    from epi.formats.trace import read_trace

    tdir, _, _, _ = synth_run()  # type: ignore[operator]  # the fixture's factory
    (samples,) = sorted(tdir.glob("seg-*.samples.csv"))
    lines = samples.read_text().splitlines()
    fields = lines[-1].split(",")
    fields[0] = str(2**63)  # one past int64
    samples.write_text("\n".join([*lines[:-1], ",".join(fields)]) + "\n")
    with _pytest.raises(UserError) as info:
        read_trace(tdir)
    message = str(info.value)
    assert "is 9223372036854775808, expected an integer in [0, 9223372036854775807]" in message
    assert "truncated" not in message and "\n" not in message


def test_a_damaged_time_that_collides_with_the_final_row_refuses_instead_of_dropping_it(
        tmp_path: Path) -> None:
    """An earlier row's time damaged to the final row's value makes the final row look out of
    order; it has all its fields, so no crash cut it: the segment is refused naming the final
    line (the collision), and the final row is never dropped as 'truncated'. Hypothesis found
    this with row 8 of 10 set to the last row's time."""
    rows = [(0, 100), (1, 101), (0, 200), (1, 201), (0, 300), (1, 301)]
    _segment(tmp_path, 1, rows)
    samples = tmp_path / "seg-000001.samples.csv"
    lines = samples.read_text().splitlines()
    fields = lines[4].split(",")  # channel 1 at 201 → 301, the final row's time
    fields[SAMPLE_COLUMNS.index("t_mono_ns")] = "301"
    lines[4] = ",".join(fields)
    samples.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=r"line 7: .*channel 1 t_mono_ns is duplicated"):
        read_trace(tmp_path)


def test_a_channel_outside_the_meta_in_the_final_row_is_refused(tmp_path: Path) -> None:
    """A complete final row naming a channel the meta lacks is a wrong value: refused."""
    _segment(tmp_path, 1, [(0, 100), (1, 101), (0, 200), (1, 201)])
    samples = tmp_path / "seg-000001.samples.csv"
    lines = samples.read_text().splitlines()
    fields = lines[-1].split(",")
    fields[SAMPLE_COLUMNS.index("channel")] = "7"
    lines[-1] = ",".join(fields)
    samples.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=r"line 5: .*channel 7 is not in the meta"):
        read_trace(tmp_path)
