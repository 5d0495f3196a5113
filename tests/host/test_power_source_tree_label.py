"""The process-tree activity model is named as its own model wherever the power source is."""

from __future__ import annotations

from pathlib import Path

from host.analysis.power_source import is_modelled, model_label
from meter.clock import SimulatedClock
from meter.emulation.power_models import ActivityModel, ProcessTreeActivityModel


def test_each_activity_model_has_its_own_label(tmp_path: Path) -> None:
    clock = SimulatedClock()
    tree = ProcessTreeActivityModel(clock, tmp_path / "follow.pids").describe()
    whole = ActivityModel(clock).describe()
    assert model_label(tree) == "modelled (ActivityModel, process tree)"
    assert model_label(whole) == "modelled (ActivityModel)"
    assert is_modelled(model_label(tree))
    assert model_label({"kind": "scripted"}) == "modelled (scripted profile)"
