"""Study files, generated and named hostile values: names with newlines, thread
counts and seeds far out of range, the same map twice, two models with one name, repeats at
2**63, an infinite idle settle. Each either loads (in range) or is refused with one line that
names the file and the field — never another exception, never a hang (load_study runs in a
worker with a time limit)."""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epi.core.errors import UserError
from host.campaign.study import load_study

MAP = Path(__file__).resolve().parents[2] / "quantmaps" / "uniform_q8.json"
TIME_LIMIT_S = 20.0


def _val(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v == math.inf else
                                            "-inf" if v == -math.inf else repr(v))
    if isinstance(v, int):
        return str(v)
    return json.dumps(v)


def _study(d: Path, section: str, key: str, value: object, *, extra: str = "") -> Path:
    (d / "base.gguf").write_bytes(b"GGUF")
    tables: dict[str, dict[str, object]] = {"study": {"repeats": 2}, "run": {},
                                             "meter": {"emulate": True}, "thermal": {}}
    if section == "decide":  # [decide] takes the rounds from itself: no study.repeats
        tables["study"] = {}
        tables["decide"] = {}
    tables.setdefault(section, {})[key] = value
    text = "".join(f"[{name}]\n" + "".join(f"{k} = {_val(v)}\n" for k, v in body.items())
                   for name, body in tables.items())
    text += f'[[models]]\nname = "m"\npath = "base.gguf"\nmaps = [{json.dumps(str(MAP))}]\n'
    p = d / "s.toml"
    p.write_text(text + extra)
    return p


def _load_or_one_line(p: Path) -> str | None:
    """None when the study loads; the error text when refused. Fails on anything else."""
    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(load_study, p)
        try:
            fut.result(timeout=TIME_LIMIT_S)
        except UserError as exc:
            text = str(exc)
            assert "\n" not in text and str(p) in text, text
            return text
    return None


@pytest.mark.parametrize(("section", "key", "value", "field"), [
    ("study", "name", "a\nb", "study.name"),
    ("study", "name", "../up", "study.name"),
    ("study", "seed", 2**63, "study.seed"),
    ("study", "seed", -1, "study.seed"),
    ("study", "repeats", 2**63 - 1, "study.repeats"),
    ("study", "repeats", 0, "study.repeats"),
    ("run", "threads", 10**9, "run.threads"),
    ("run", "threads", 0, "run.threads"),
    ("run", "idle_s", math.inf, "run.idle_s"),
    ("run", "idle_s", math.nan, "run.idle_s"),
    ("run", "cooldown_s", math.inf, "run.cooldown_s"),
    ("thermal", "wait_s", math.inf, "thermal.wait_s"),
    ("thermal", "timeout_s", math.inf, "thermal.timeout_s"),
    ("decide", "remeasure", 2**63 - 1, "decide.remeasure"),
    ("decide", "remeasure", -1, "decide.remeasure"),
    ("decide", "remeasure", math.nan, "decide.remeasure"),
    ("analysis", "guidance_accuracy_loss", 1.5, "analysis.guidance_accuracy_loss"),
    ("analysis", "guidance_accuracy_loss", -0.1, "analysis.guidance_accuracy_loss"),
    ("analysis", "guidance_accuracy_loss", math.nan, "analysis.guidance_accuracy_loss"),
    ("analysis", "guidance_j_budget", 0.5, "analysis.guidance_j_budget"),
    ("analysis", "guidance_j_budget", math.inf, "analysis.guidance_j_budget"),
    ("analysis", "guidance_j_budget", "1.1", "analysis.guidance_j_budget"),
])
def test_named_hostile_values_are_refused_in_one_line(tmp_path: Path, section: str, key: str,
                                                      value: object, field: str) -> None:
    text = _load_or_one_line(_study(tmp_path, section, key, value))
    assert text is not None, f"{field} = {value!r} was accepted"
    assert field.split(".")[-1] in text


def test_the_guidance_thresholds_reach_the_analysis_options(tmp_path: Path) -> None:
    p = _study(tmp_path, "analysis", "guidance_accuracy_loss", 0.05,
               extra="")
    p.write_text(p.read_text().replace("guidance_accuracy_loss = 0.05",
                                       "guidance_accuracy_loss = 0.05\nguidance_j_budget = 1.3"))
    study = load_study(p)
    opts = study.analysis.options(None)
    assert (opts.guidance_accuracy_loss, opts.guidance_j_budget) == (0.05, 1.3)
    default = load_study(_study(tmp_path, "study", "repeats", 2)).analysis.options(None)
    assert (default.guidance_accuracy_loss, default.guidance_j_budget) == (0.02, 1.10)


def test_a_model_name_with_a_newline_is_refused(tmp_path: Path) -> None:
    p = _study(tmp_path, "study", "repeats", 2)
    p.write_text(p.read_text().replace('name = "m"', 'name = "m\\nx"'))
    text = _load_or_one_line(p)
    assert text is not None and "models[0].name" in text


def test_the_same_map_twice_is_refused(tmp_path: Path) -> None:
    p = _study(tmp_path, "study", "repeats", 2)
    p.write_text(p.read_text().replace(f"maps = [{json.dumps(str(MAP))}]",
                                       f"maps = [{json.dumps(str(MAP))}, "
                                       f"{json.dumps(str(MAP))}]"))
    text = _load_or_one_line(p)
    assert text is not None and "maps" in text


def test_two_models_with_one_name_are_refused(tmp_path: Path) -> None:
    p = _study(tmp_path, "study", "repeats", 2,
               extra=f'[[models]]\nname = "m"\npath = "base.gguf"\n'
                     f"maps = [{json.dumps(str(MAP))}]\n")
    text = _load_or_one_line(p)
    assert text is not None and "models[1].name" in text and "already" in text


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=st.sampled_from([("study", "seed"), ("study", "repeats"), ("study", "name"),
                              ("study", "baseline"), ("run", "threads"), ("run", "tokens"),
                              ("run", "idle_s"), ("run", "cooldown_s"),
                              ("run", "repeats_per_run"), ("thermal", "wait_s"),
                              ("thermal", "timeout_s"), ("thermal", "poll_s"),
                              ("thermal", "window_s"), ("meter", "rate_hz"),
                              ("decide", "remeasure"), ("decide", "min_rounds"),
                              ("decide", "max_rounds"), ("decide", "time_budget_min"),
                              ("decide", "margin_pct"), ("decide", "alpha"),
                              ("decide", "size_runs"), ("decide", "size_for_pct")]),
       value=st.one_of(st.integers(-2**64, 2**64 - 1).filter(lambda i: -2**63 <= i < 2**63),
                       st.sampled_from([2**63 - 1, -2**63, 2**31, 10**12]),
                       st.floats(allow_nan=True, allow_infinity=True),
                       st.text(max_size=12), st.booleans()))
def test_generated_values_load_or_give_one_line(tmp_path_factory: pytest.TempPathFactory,
                                                 where: tuple[str, str], value: object) -> None:
    d = tmp_path_factory.mktemp("s")
    _load_or_one_line(_study(d, where[0], where[1], value))


SPLIT_NAMES = ["uniform_q8", "base", "s", "x y", "", "a\nb", 3]
SPLIT_TABLES = st.lists(st.one_of(
    st.fixed_dictionaries({"id": st.sampled_from(SPLIT_NAMES),
                           "prefill": st.sampled_from(SPLIT_NAMES),
                           "decode": st.sampled_from(SPLIT_NAMES)}),
    st.fixed_dictionaries({}, optional={"id": st.sampled_from(SPLIT_NAMES),
                                        "prefill": st.sampled_from(SPLIT_NAMES),
                                        "bogus": st.integers()}),
    st.sampled_from([1, "s", [], True])), max_size=3)


def _toml(v: object) -> str:
    """A TOML inline value (tables inline: { k = v, ... })."""
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml(x)}" for k, x in v.items()) + " }"
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return _val(v)


@settings(max_examples=80, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(splits=SPLIT_TABLES, include_base=st.booleans())
def test_generated_splits_load_or_give_one_line(tmp_path_factory: pytest.TempPathFactory,
                                                splits: list[object],
                                                include_base: bool) -> None:
    from host.campaign.plan import configurations

    d = tmp_path_factory.mktemp("s")
    (d / "base.gguf").write_bytes(b"GGUF")
    p = d / "s.toml"
    p.write_text(f'[study]\nrepeats = 2\n[meter]\nemulate = true\n'
                 f'[[models]]\nname = "m"\npath = "base.gguf"\n'
                 f"include_base = {'true' if include_base else 'false'}\n"
                 f"maps = [{json.dumps(str(MAP))}]\nsplits = {_toml(splits)}\n")
    try:
        configurations(load_study(p))
    except UserError as exc:
        assert "\n" not in str(exc) and str(p) in str(exc), str(exc)
        assert "TOML" not in str(exc), str(exc)  # the generator writes valid TOML


# ---- several meters: generated [[meter]] lists -------------------------------------------
URLS = ["http://a:8757", "http://A:8757/", "http://b:8757", "https://b", "b:1", ""]
NODES = ["n0", "n1", "n2", "x y", ""]
TRACES = ["ta", "tb", "tc", "ta/", ""]
# mostly well-formed tables (a URL, a trace, nodes), so that lists reach the cross-meter
# checks (one URL, trace and node per meter); some with anything in any field
METER_FIELDS = st.one_of(
    st.fixed_dictionaries(
        {"url": st.sampled_from(URLS[:4]), "trace": st.sampled_from(TRACES[:4]),
         "nodes": st.lists(st.sampled_from(NODES[:3]), min_size=1, max_size=2)},
        optional={"emulate": st.booleans()}),
    st.fixed_dictionaries({"emulate": st.just(True),
                           "nodes": st.lists(st.sampled_from(NODES[:3]), min_size=1,
                                             max_size=2)}),
    st.fixed_dictionaries({}, optional={
        "url": st.sampled_from(URLS), "trace": st.sampled_from(TRACES),
        "emulate": st.booleans(), "rate_hz": st.sampled_from([0.0, 20.0, math.inf]),
        "activity": st.sampled_from(["machine", "nope"]),
        "nodes": st.lists(st.sampled_from(NODES), max_size=5)}))


def _meters_study(d: Path, meters: list[dict[str, object]]) -> Path:
    (d / "base.gguf").write_bytes(b"GGUF")
    text = "".join("[[meter]]\n" + "".join(
        f"{k} = [{', '.join(json.dumps(x) for x in v)}]\n" if isinstance(v, list)
        else f"{k} = {_val(v)}\n" for k, v in m.items()) for m in meters) if meters \
        else "meter = []\n"
    text += f'[[models]]\nname = "m"\npath = "base.gguf"\nmaps = [{json.dumps(str(MAP))}]\n'
    p = d / "s.toml"
    p.write_text(text)
    return p


WELL_FORMED = st.fixed_dictionaries(  # each table fine alone: only the list can be wrong
    {"url": st.sampled_from(URLS[:4]), "trace": st.sampled_from(TRACES[:4]),
     "nodes": st.lists(st.sampled_from(NODES[:3]), min_size=1, max_size=2, unique=True)})


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(meters=st.lists(METER_FIELDS, max_size=4))
def test_generated_meter_lists_load_with_one_meter_per_url_trace_and_node_or_give_one_line(
        tmp_path_factory: pytest.TempPathFactory, meters: list[dict[str, object]]) -> None:
    """Hostile meter lists (duplicate URLs spelled differently, a node on two meters, an empty
    list, a URL without its trace, ...): refused in one line naming the file and a `meter`
    field, or loaded with what several meters need — no URL, trace directory or node on two
    meters, a trace with every URL, nodes on every meter of several."""
    _check_meter_list(tmp_path_factory.mktemp("m"), meters)


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(meters=st.lists(WELL_FORMED, min_size=2, max_size=3))
def test_generated_lists_of_well_formed_meters_never_share_a_url_trace_or_node(
        tmp_path_factory: pytest.TempPathFactory, meters: list[dict[str, object]]) -> None:
    """Tables each fine alone, from small pools (the same URL or trace spelled two ways, the
    same node): only the cross-meter checks stand between them and a study that meters one
    node twice or reads one trace as two meters'."""
    _check_meter_list(tmp_path_factory.mktemp("w"), meters)


def _check_meter_list(d: Path, meters: list[dict[str, object]]) -> None:
    p = _meters_study(d, meters)
    text = _load_or_one_line(p)
    if text is not None:
        assert "field 'meter" in text, text
        return
    s = load_study(p)
    assert len(s.meters) == len(meters) >= 1
    urls = [m.url.rstrip("/").lower() for m in s.meters if m.url]
    assert len(urls) == len(set(urls))
    traces = [m.trace.resolve() for m in s.meters if m.trace is not None]
    assert len(traces) == len(set(traces))
    nodes = [n for m in s.meters for n in m.nodes]
    assert len(nodes) == len(set(nodes))
    for m in s.meters:
        assert bool(m.url) != m.emulate and (m.trace is not None) == bool(m.url)
        assert len(s.meters) == 1 or m.nodes


@pytest.mark.parametrize(("meters", "field"), [
    ([], "meter"),
    ([{"url": "http://a:1", "trace": "t", "nodes": ["n"]},
      {"url": "http://A:1/", "trace": "u", "nodes": ["m"]}], "meter[1].url"),
    ([{"emulate": True, "nodes": ["n"]}, {"emulate": True, "nodes": ["n"]}], "meter[1].nodes[0]"),
    ([{"url": "http://a:1", "nodes": ["n"]}], "meter[0].trace"),
])
def test_named_hostile_meter_lists(tmp_path: Path, meters: list[dict[str, object]],
                                   field: str) -> None:
    """The four the issue names: an empty list, one URL twice, a node on two meters, a
    trace path missing."""
    text = _load_or_one_line(_meters_study(tmp_path, meters))
    assert text is not None and f"field '{field}'" in text, text


def test_an_absurd_rate_gives_a_plan_not_a_crash(tmp_path: Path) -> None:
    """`decode_tok_s = 5e-324` is a positive number, so the study loads; the plan's estimate
    (tokens ÷ 5e-324 = inf seconds) reads as 'more than a century', never an OverflowError."""
    from epi.core.text import format_duration
    from host.campaign.plan import build_plan, plan_text

    p = _study(tmp_path, "estimate", "decode_tok_s", 5e-324)
    plan = build_plan(load_study(p))
    text = "\n".join(plan_text(plan))
    assert "more than a century" in text
    assert format_duration(float("inf")) == "more than a century"
    assert format_duration(float("nan")) == "unknown"
    assert format_duration(3723) == "1h02m03s"  # closed form: 1 h, 2 min, 3 s


FRACTION_KEYS = ("cv_threshold", "max_offset_frac", "max_lag_error_frac", "ppl_tolerance",
                 "guidance_accuracy_loss", "guidance_j_budget",
                 "max_resolution_frac")


@pytest.mark.parametrize("key", FRACTION_KEYS)
@pytest.mark.parametrize("value", [0.0, 1e-9, 0.5, 1.0, 1.5, -0.1, math.nan, math.inf])
def test_an_analysis_fraction_is_refused_exactly_when_the_cli_refuses_it(
        tmp_path: Path, key: str, value: float) -> None:
    """One rule for the study file and `epi analyze`: the option of the same name decides."""
    import click

    from epi.commands.analyze import analyze

    flag = "--" + key.replace("_", "-")
    try:
        analyze.make_context("analyze", ["run", "--trace", "t", flag, repr(value)])
        cli_ok = True
    except click.UsageError:
        cli_ok = False
    study_ok = _load_or_one_line(_study(tmp_path, "analysis", key, value)) is None
    assert study_ok == cli_ok, (key, value)


@pytest.mark.parametrize(("section", "key"), [("study", "name"), ("models", "name")])
def test_a_name_ending_in_a_newline_is_refused(tmp_path: Path, section: str, key: str) -> None:
    p = _study(tmp_path, "study", "repeats", 2)
    text = p.read_text()
    if section == "study":
        text = text.replace("[study]\n", '[study]\nname = "demo\\n"\n')
    else:
        text = text.replace('name = "m"', 'name = "m\\n"')
    p.write_text(text)
    msg = _load_or_one_line(p)
    assert msg is not None and "name" in msg
