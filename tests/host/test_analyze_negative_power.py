"""A reversed CT clamp (negative power_w with a positive cumulative energy) is flagged beyond
the window: the run's verdict is invalid with the fix named, and the trapezoid J/token is
never a valid negative figure. Trace and token log written per docs/formats.md by the
fixtures (tests/host/conftest.py)."""

from __future__ import annotations

import numpy as np

from host.analysis.pipeline import Options, analyze
from host.analysis.traces import REVERSED_CT_HINT


def _reverse_ct(tdir) -> None:
    """Negate every power_w of the trace, keep energy_j (the chip counts |P|)."""
    for path in tdir.glob("seg-*.samples.csv"):
        lines = path.read_text().splitlines()
        out = [lines[0]]
        for ln in lines[1:]:
            f = ln.split(",")
            f[4] = repr(-float(f[4]))
            out.append(",".join(f))
        path.write_text("\n".join(out) + "\n")


def test_reversed_ct_invalidates_the_run_and_the_trapezoid_j_per_token(synth_run):
    tdir, rdir, _, _ = synth_run()
    _reverse_ct(tdir)
    a = analyze([rdir], tdir, Options(energy_method="trapezoid"))
    v = a.verdicts.set_index("phase")
    for phase in ("request", "prefill", "decode", "idle"):
        assert not v.loc[phase, "valid"], phase
        assert "CT reversed?" in v.loc[phase, "reasons"]
        assert "turn the CT so its arrow points to the load" in v.loc[phase, "reasons"]
    w = a.windows[(a.windows["scope"] == "all") & (a.windows["kind"] == "request")]
    assert w["energy_j"].isna().all()  # never a negative energy taken as valid
    assert REVERSED_CT_HINT in w["reason"].iloc[0]
    res = a.results[(a.results["scope"] == "all") & (a.results["phase"] == "request")
                    & (a.results["unit"] == "generated")]
    assert res["j_per_token_median"].isna().all()
    assert res["reason"].str.contains("CT reversed?").all()
    assert not (a.repeats["j_per_token"].dropna() < 0).any()


def test_reversed_ct_is_flagged_with_the_counter_method_too(synth_run):
    tdir, rdir, _, _ = synth_run()
    _reverse_ct(tdir)
    a = analyze([rdir], tdir)  # counter: the energy itself is positive, the power is not
    v = a.verdicts.set_index("phase")
    assert not v.loc["request", "valid"] and "CT reversed?" in v.loc["request", "reasons"]
    h = a.results[(a.results["scope"] == "all") & (a.results["phase"] == "request")]
    assert np.isnan(h["j_per_token_median"]).all()
