"""The accuracy stage's time probe opens the context the stage itself opens: 25-shot
ARC-Challenge items (~1,000 tokens with their shots) are projected, not refused against the
probe's default 512-token context (a campaign's probe once failed so, and fell back to the
study file's assumed rate)."""

from __future__ import annotations

import pytest

from host.accuracy import estimate


@pytest.mark.slow
def test_a_25_shot_arc_projection_opens_a_context_that_holds_its_items() -> None:
    from host.accuracy import evaldata
    from host.quant.models import prepare_model

    model = prepare_model("smollm2").path
    assert model is not None
    root = evaldata.data_dir()
    evaldata.ensure_prepared(["arc_challenge"], root=root)
    p = estimate.projected_seconds(model, ["arc_challenge"], 3, threads=2, probe_items=2,
                                   data_dir=root, shots={"arc_challenge": 25})
    b = p["benches"]["arc_challenge"]
    assert b["n"] == 3 and b["s_per_token"] > 0
    # the shot prefix (counted once, shared) alone is longer than the default context
    assert b["prefix_tokens"] > estimate.DEFAULT_CTX
