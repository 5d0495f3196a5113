"""A trace joined from several meters labels each channel from the meter it came from.

Two meters of one study can follow different power sources (one a process-tree model, one the
whole machine; or one real board and one emulator). The joined trace keeps the first trace's
segments, so a label read from those segments alone would give every channel meter 1's source:
a figure on meter 2's node would state the wrong power source. The expected labels here come
from `model_label`'s documented names for each segment's own `power_model`.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd

from host.analysis.instrument import _channel_meta
from host.analysis.power_source import MEASURED, channel_sources
from host.analysis.traces import Trace


def _trace(name: str, meta: dict[str, Any], channels: list[int]) -> Trace:
    seg: Any = SimpleNamespace(meta=meta)
    infos: Any = {ch: SimpleNamespace(scope="wall", source=None) for ch in channels}
    return Trace(Path(name), [seg], infos, pd.DataFrame(), pd.DataFrame(), {}, {})


TREE = {"emulated": True, "power_model": {"kind": "activity_process_tree"},
        "channels": [{"channel": 0, "calibration": {"source": "tree-board"}}]}
MACHINE = {"emulated": True, "power_model": {"kind": "activity"},
           "channels": [{"channel": 0, "calibration": {"source": "machine-board"}}]}


def test_each_joined_channel_carries_its_own_meters_power_source() -> None:
    a, b = _trace("a", TREE, [0]), _trace("b", MACHINE, [0])
    assert channel_sources(a) == {0: "modelled (ActivityModel, process tree)"}
    assert channel_sources(b) == {0: "modelled (ActivityModel)"}
    joined = _trace("a", TREE, [0, 1])  # trace 0's segments, channel 1 renumbered from b
    joined.origins = {0: (a, 0), 1: (b, 0)}
    assert channel_sources(joined) == {0: "modelled (ActivityModel, process tree)",
                                       1: "modelled (ActivityModel)"}
    assert joined.power_models == [{"kind": "activity_process_tree"}, {"kind": "activity"}]
    # the instrument terms read each channel's calibration from its own trace's meta
    assert {ch: m["calibration"] for ch, m in _channel_meta(joined).items()} == {
        0: {"source": "tree-board"}, 1: {"source": "machine-board"}}


def test_a_real_meter_joined_with_an_emulated_one_is_labelled_per_channel() -> None:
    real = _trace("real", {"channels": []}, [0])
    emu = _trace("emu", MACHINE, [0])
    joined = _trace("real", {"channels": []}, [0, 1])
    joined.origins = {0: (real, 0), 1: (emu, 0)}
    assert channel_sources(joined) == {0: MEASURED, 1: "modelled (ActivityModel)"}
    assert joined.emulated  # the run's figures are not all measured: the report must say so
    assert not real.emulated
