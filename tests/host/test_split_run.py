"""`epi run MODEL --decode-model OTHER`: a split configuration's token log (host/run/split.py).

The handover is stamped as its own interval inside each request, run.json names which GGUF ran
which phase and how much memory both took, and a split with one map for both phases generates
the tokens of the unsplit run.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from epi.formats.tokenlog import read_token_log
from host.gguf_io.file import sha256_file
from host.quant.gguf_info import read_model
from host.quant.mixmap import load_mixmap
from host.quant.quantize import quantize_map
from host.quant.tiny_model import write_test_model
from host.run.runner import RunSettings, run
from tests.cli_run import run_epi as _epi
from tests.host.test_runner import SMALL_PROMPTS

REPO = Path(__file__).resolve().parents[2]
TOKENS = 6


@pytest.fixture(scope="module")
def tiny_q8(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("q8")
    return quantize_map(load_mixmap(REPO / "quantmaps" / "uniform_q8.json"),
                        read_model(tiny_model), sha256_file(tiny_model), out, threads=1).output


def _run(model: Path, decode: Path | None, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    prompts = out.parent / "prompts.json"
    prompts.write_text(json.dumps(SMALL_PROMPTS))
    run(RunSettings(model=model, out=out, prompts=prompts, tokens=TOKENS, repeats=1, warmups=0,
                    threads=1, idle_s=0.0, cooldown_s=0.0, decode_model=decode),
        echo=lambda line: None)
    return out


def _events(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "events.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def _tokens(run_dir: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for e in _events(run_dir):
        if e["event"] == "token":
            out.setdefault(e["prompt_id"], []).append(e["token_id"])
    return out


@pytest.mark.slow
@pytest.mark.shares_cpu
def test_a_split_run_stamps_the_handover_inside_each_request(
        tiny_model: Path, tiny_q8: Path, tmp_path: Path) -> None:
    run_dir = _run(tiny_model, tiny_q8, tmp_path / "split")
    header = json.loads((run_dir / "run.json").read_text())
    assert header["status"] == "completed"
    split = header["split"]
    assert split["prefill"]["sha256"] == sha256_file(tiny_model)
    assert split["decode"]["sha256"] == sha256_file(tiny_q8)
    # both GGUFs' weights are resident: the memory is at least their two file sizes
    assert split["resident_mib"] * 2**20 >= tiny_model.stat().st_size + tiny_q8.stat().st_size
    by_request: dict[str, list[dict[str, str]]] = {}
    for e in _events(run_dir):
        if e["request_id"]:
            by_request.setdefault(e["request_id"], []).append(e)
    assert len(by_request) == len(SMALL_PROMPTS["prompts"])  # type: ignore[arg-type]
    for rows in by_request.values():
        kinds = [(r["event"], r["token_index"]) for r in rows]
        assert kinds[:5] == [("request_start", ""), ("token", "0"), ("handover_start", ""),
                             ("handover_end", ""), ("token", "1")]
        assert kinds[-1] == ("request_end", "")
        t = [int(r["t_mono_ns"]) for r in rows]
        assert t == sorted(t) and t[3] > t[2]  # the handover takes time, in the request
    log = read_token_log(run_dir)  # the one reader accepts the new events
    assert len(log.requests["request_id"]) == len(by_request)


@pytest.mark.slow
@pytest.mark.shares_cpu
def test_one_map_for_both_phases_generates_the_unsplit_tokens(
        tiny_model: Path, tmp_path: Path) -> None:
    plain = _run(tiny_model, None, tmp_path / "a" / "plain")
    split = _run(tiny_model, tiny_model, tmp_path / "b" / "split")
    assert _tokens(split) == _tokens(plain)
    assert len(_tokens(plain)["long"]) == TOKENS


def test_a_decode_model_of_another_base_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str],
                                                   tiny_model: Path, tmp_path: Path) -> None:
    other = write_test_model(tmp_path / "other.gguf", n_layers=2)
    code, _, err = _epi(monkeypatch, capsys, "run", str(tiny_model), "--out",
                        str(tmp_path / "o"), "--decode-model", str(other))
    assert code == 2 and err.count("\n") == 1, err
    assert "not quantizations of one base model (n_layers 8 vs 2)" in err
    assert not (tmp_path / "o").exists()


def test_a_split_over_rpc_workers_is_refused(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str],
                                             tiny_model: Path, tmp_path: Path) -> None:
    code, _, err = _epi(monkeypatch, capsys, "run", str(tiny_model), "--out",
                        str(tmp_path / "o"), "--decode-model", str(tiny_model),
                        "--workers", "a=127.0.0.1:1")
    assert code == 2 and "runs on one node only" in err and err.count("\n") == 1, err


@pytest.mark.slow
@pytest.mark.shares_cpu
def test_the_handover_cost_per_request_is_read_from_the_log(
        tiny_model: Path, tiny_q8: Path, tmp_path: Path) -> None:
    from epi.core.errors import UserError
    from host.analysis.split import HandoverCost, handover_costs, median_share

    run_dir = _run(tiny_model, tiny_q8, tmp_path / "split")
    costs = handover_costs(run_dir)
    rows = _events(run_dir)
    # independently: the stamps of each request's events, straight from events.csv
    for c in costs:
        mine = {r["event"] + r["token_index"]: int(r["t_mono_ns"]) for r in rows
                if r["request_id"] == str(c.request_id)}
        assert c.handover_ns == mine["handover_end"] - mine["handover_start"] > 0
        assert c.prefill_ns == mine["token0"] - mine["request_start"] > 0
        assert HandoverCost.from_json(c.to_json()) == c
    assert len(costs) == 2
    share = median_share(costs)
    assert share is not None and share > 0
    plain = _run(tiny_model, None, tmp_path / "p" / "plain")
    with pytest.raises(UserError, match="not a split configuration"):
        handover_costs(plain)
