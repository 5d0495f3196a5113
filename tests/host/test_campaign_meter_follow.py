"""The campaign's emulated daemon: channel 0 follows the campaign's process tree by default.

Starts the real daemon (`epi meter run --emulate`) the way a campaign does and reads what it
recorded in its trace: the process-tree model with the campaign's PID as its root (so the
report labels it `modelled (ActivityModel, process tree)`), or, with activity = "machine",
the whole-machine model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from epi.core.errors import UserError
from host.campaign.meter import FOLLOW_PIDS, emulated_daemon, follow_env


def _power_model(trace: Path) -> dict:
    metas = sorted(trace.glob("seg-*.meta.json"))
    assert metas, f"no segment in {trace}"
    meta = json.loads(metas[-1].read_text())
    return meta["power_model"]


def _channel0(model: dict) -> dict:
    return model["channels"]["0"] if model.get("kind") == "per_channel" else model


@pytest.mark.parametrize(("activity", "kind"), [("process_tree", "activity_process_tree"),
                                                ("machine", "activity")])
def test_daemon_models_the_chosen_activity(tmp_path: Path, activity: str, kind: str) -> None:
    trace = tmp_path / "trace"
    with emulated_daemon(tmp_path, trace, 20.0, activity=activity) as url:
        assert url.startswith("http://127.0.0.1:")
    ch0 = _channel0(_power_model(trace))
    assert ch0["kind"] == kind and ch0["modelled"] is True
    if activity == "process_tree":
        assert (tmp_path / FOLLOW_PIDS).read_text().split() == [str(os.getpid())]
        assert ch0["roots"] == [os.getpid()]
        assert ch0["follow_file"] == str((tmp_path / FOLLOW_PIDS).resolve())


def test_unknown_activity_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="meter activity must be one of process_tree, machine"):
        follow_env(tmp_path, "gpu")
