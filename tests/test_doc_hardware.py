"""docs/hardware.md, the first day with the board, runs as written against the emulator:
every command of the page, in order (tests/doc_commands.py), with the tiny model for the
first run and free ports for the daemon and the worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from epi.core.net import free_port
from tests.doc_commands import REPO, commands, run_page

PAGE = REPO / "docs" / "hardware.md"


def test_the_page_has_the_ten_steps_and_their_commands() -> None:
    text = PAGE.read_text()
    for n in range(1, 11):
        assert f"\n## {n}. " in text, n
    lines = [c.line for c in commands(PAGE)]
    for needed in ("epi doctor", "epi meter plan", "epi meter calibrate", "epi meter qualify",
                   "epi meter run", "epi meter watch", "epi worker", "epi meter sync",
                   "epi run", "epi analyze"):
        assert any(line.startswith(needed) for line in lines), needed


@pytest.mark.slow
@pytest.mark.shares_cpu  # no timing of it is checked: it may run beside another test
def test_every_command_of_the_first_day_runs_against_the_emulator(tmp_path: Path) -> None:
    from host.quant.models import prepare_model

    model = prepare_model("smollm2").path  # what the page's `epi model prepare` prints
    subs = {"MODEL.gguf": str(model), "8757": str(free_port()),
            "50052": str(free_port()), "hardware/": str(REPO / "hardware") + "/",
            # the page's head and worker are two Pi nodes with 4 cores each; here they share
            # this machine's cores, so each gets one thread: ggml's threads spin at every
            # barrier, and with more threads than free cores (a busy machine) a run took
            # 343 s to over 900 s instead of 47 s
            "epi worker --port": "epi worker --threads 1 --port",
            "--node pi-node-0": "--threads 1 --node pi-node-0"}
    run_page(PAGE, tmp_path, subs)
    lab = tmp_path / "epi-lab"
    assert (lab / "calibration" / "node0.json").is_file()
    assert (lab / "analysis" / "results.csv").is_file()
    # a first J/token: the run's headline figure exists, or its refusal says why
    import pandas as pd

    res = pd.read_csv(lab / "analysis" / "results.csv")
    head = res[(res["scope"] == "all") & (res["phase"] == "request")
               & (res["unit"] == "generated")]
    assert len(head) >= 1
    assert all(pd.notna(r.j_per_token_median) or str(r.reason).strip()
               for r in head.itertuples())
