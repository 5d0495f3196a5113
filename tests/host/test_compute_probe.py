"""The compute probe: its difference estimator against a closed form, a real llama.cpp run, and
the bandwidth answer's compute term from a probe file."""

from __future__ import annotations

from pathlib import Path

import pytest

from epi.core.errors import UserError
from host.run import compute_probe as cp
from host.run.compute_probe import ComputeProbe, TypeCost, read_probe, write_probe


@pytest.mark.long  # over 1.5 s on an idle 2-core machine (2.2-2.7 s measured)
def test_the_difference_cancels_what_the_two_models_share(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """Decode time per token = shared overhead + cost × block weights (a closed form with a
    large shared term): the probe recovers the cost per weight exactly."""
    cost = {"Q4_0": 2e-11, "Q8_0": 5e-11}
    weights = {0: 1_000_000, 1: 3_000_000}  # small and large models' block weights
    shared_s = 0.004  # embedding, output matrix, sampling: 40× the small model's blocks

    def fake_quantize(base: Path, out: Path, type_name: str, threads: int) -> None:
        out.write_text(f"{type_name} {base.name}")

    def fake_block_weights(path: Path) -> int:
        return weights[1 if "base4" in path.read_text() else 0]

    def fake_decode(path: Path, threads: int, tokens: int):  # type: ignore[no-untyped-def]
        typ, base = path.read_text().split()
        n = weights[1 if base == "base4.gguf" else 0]
        return lambda: shared_s + cost[typ] * n

    monkeypatch.setattr(cp, "_quantize", fake_quantize)
    monkeypatch.setattr(cp, "_block_weights", fake_block_weights)
    monkeypatch.setattr(cp, "_decode_s_per_token", fake_decode)
    probe = cp.probe_compute(["Q8_0", "Q4_0"], threads=1, repeats=5)
    for t, c in cost.items():
        assert probe.costs[t].s_per_weight == pytest.approx(c, rel=1e-9)
        assert probe.costs[t].extra_weights == 2_000_000
    # the working set: Q8_0 stores 34 bytes per 32 weights, Q4_0 18 bytes per 32
    assert probe.costs["Q8_0"].working_set_bytes == 2_000_000 * 34 // 32
    assert probe.costs["Q4_0"].working_set_bytes == 2_000_000 * 18 // 32


def test_compute_per_token_is_the_weighted_sum_and_refuses_unprobed_types() -> None:
    c = {t: TypeCost(t, v, v, v, 0.9, 5, 1, 1, True) for t, v in (("Q4_0", 1e-10),
                                                                 ("Q8_0", 2e-10))}
    probe = ComputeProbe("n", "b", 1, None, c)
    assert probe.compute_s_per_token({"Q4_0": 1000, "Q8_0": 500}) == pytest.approx(2e-7)
    assert probe.compute_s_per_token({"Q6_K": 10}) is None


def test_a_probe_file_round_trips_and_a_bad_one_is_one_line(tmp_path: Path) -> None:
    c = {"Q4_0": TypeCost("Q4_0", 1e-10, 9e-11, 2e-10, 0.98, 7, 100, 50, None)}
    p = ComputeProbe("node0", "build", 2, 1 << 20, c)
    write_probe(p, tmp_path / "c.json")
    assert read_probe(tmp_path / "c.json") == p
    (tmp_path / "bad.json").write_text('{"format": "epi-compute-probe", "costs": 3}')
    with pytest.raises(UserError, match=r"bad\.json: malformed compute probe"):
        read_probe(tmp_path / "bad.json")
    with pytest.raises(UserError, match=r"unknown\.json"):
        read_probe(tmp_path / "unknown.json")


def test_a_type_without_a_pure_file_type_is_refused() -> None:
    with pytest.raises(UserError, match="IQ2_XXS"):
        cp.probe_compute(["IQ2_XXS"], threads=1)


@pytest.mark.slow
def test_a_real_probe_measures_positive_costs_with_intervals() -> None:
    probe = cp.probe_compute(["Q4_0"], threads=1, repeats=5, tokens=48)
    c = probe.costs["Q4_0"]
    assert c.s_per_weight > 0
    assert c.ci_lo <= c.s_per_weight <= c.ci_hi
    assert c.extra_weights == 2 * (4 * 256 * 256 + 3 * 256 * 256)  # 2 blocks: attention + FFN
    assert probe.threads == 1 and "llama-cpp-python" in probe.build


def test_the_bandwidth_answer_takes_its_compute_term_from_the_probe(tmp_path: Path) -> None:
    import pandas as pd

    from host.quant.tiny_model import write_test_model
    from host.report.data import Labels, ReportData
    from host.report.work_answers import compute_per_token

    models = {f"m{n}": write_test_model(tmp_path / f"m{n}.gguf", n_layers=n, n_embd=64,
                                        n_ff=128, n_head=4) for n in (1, 2)}
    analysis = tmp_path / "out" / "analysis"
    analysis.mkdir(parents=True)
    empty = pd.DataFrame()
    rd = ReportData(analysis, {"runs": [{"config": c, "model": {"path": str(p)}}
                                        for c, p in models.items()]},
                    empty, empty, empty, empty, Labels("modelled", "t", "gross", "counter",
                                                       "step", ""))
    _, how = compute_per_token(rd)
    assert "no compute probe" in how
    probe = ComputeProbe("n", "b", 1, None, {"F16": TypeCost("F16", 1e-10, 1e-10, 1e-10, 0.9,
                                                             5, 1, 1, True)})
    (tmp_path / "out" / "probes").mkdir()
    write_probe(probe, tmp_path / "out" / "probes" / "compute.json")
    compute, how = compute_per_token(rd)
    assert "compute probe" in how and "no compute probe" not in how
    # closed form: one block = 4·64² attention + 3·64·128 FFN weights, all F16
    block = 4 * 64 * 64 + 3 * 64 * 128
    assert compute["m1"] == pytest.approx(block * 1e-10)
    assert compute["m2"] == pytest.approx(2 * block * 1e-10)
