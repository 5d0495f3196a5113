"""`epi campaign`: the study file, the interleaved plan, the journal, the thermal settle rule,
the progress ETA and the dry run (fast tests; the kill-and-resume test is in
test_campaign_resume.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epi.cli import cli
from epi.core.errors import UserError
from host.campaign.journal import Done, Journal, Session, Started
from host.campaign.plan import build_plan
from host.campaign.progress import Progress
from host.campaign.study import ThermalSpec, load_study
from host.campaign.thermal import settle, stable

REPO = Path(__file__).resolve().parents[2]
MAPS = REPO / "quantmaps"


def write_study(tmp_path: Path, extra: str = "", *, repeats: int = 3, maps: str | None = None
                ) -> Path:
    (tmp_path / "base.gguf").write_bytes(b"GGUF")  # only its size is read by the plan
    maps = maps or (f'["{MAPS}/uniform_q8.json", "{MAPS}/mix_high_early.json", '
                    f'"{MAPS}/mix_high_late.json", "{MAPS}/uniform_q4km.json"]')
    p = tmp_path / "study.toml"
    p.write_text(f"""
[study]
name = "t"
seed = 7
repeats = {repeats}
baseline = "uniform_q8"

[[models]]
name = "tiny"
path = "base.gguf"
maps = {maps}

[run]
tokens = 8

[meter]
emulate = true

[accuracy]
benchmarks = {{ arc_challenge = 20, mmlu = 30 }}
shots = {{}}  # zero-shot (few-shot studies: tests/host/accuracy/test_campaign_cluster.py)
{extra}
""")
    return p


def test_study_reads_and_resolves_paths(tmp_path):
    s = load_study(write_study(tmp_path))
    assert s.repeats == 3 and s.seed == 7 and s.out == tmp_path / "out/campaign-t"
    assert [m.name for m in s.models[0].maps] == ["uniform_q8.json", "mix_high_early.json",
                                                  "mix_high_late.json", "uniform_q4km.json"]
    assert s.accuracy.benchmarks == {"arc_challenge": 20, "mmlu": 30}


def test_maps_from_folders_and_globs(tmp_path):
    s = load_study(write_study(tmp_path, maps=f'["{MAPS}/demo", "{MAPS}/uniform_q*.json"]'))
    names = [m.name for m in s.models[0].maps]
    expected = sorted(p.name for p in (MAPS / "demo").glob("*.json"))
    assert names[:len(expected)] == expected
    assert len(names) == len(expected) + len(list(MAPS.glob("uniform_q*.json")))


@pytest.mark.parametrize(("extra", "field"), [
    ("[thermal]\nrule = \"sometimes\"", "thermal.rule"),
    ("[thermal]\nwait_s = -1", "thermal.wait_s"),
    ("[run]\nrepeats_per_run = 1", None),  # duplicate [run] table is invalid TOML
    ("[bogus]\nx = 1", "bogus"),
    ("[analysis]\nenergy_basis = \"both\"", "analysis.energy_basis"),
    ("[analysis]\nn_boot = 1000", "analysis.n_boot"),  # epi analyze has no bootstrap any more
    ("[analysis]\ncv_threshold = 1.5", "analysis.cv_threshold"),
    ("[analysis]\nlag = \"sometimes\"", "analysis.lag"),
    ("[analysis]\nmin_samples = 1", "analysis.min_samples"),
    ("[thermal]\ntolerance = nan", "thermal.tolerance"),
    ("[thermal]\ntimeout_s = inf", "thermal.timeout_s"),
])
def test_bad_fields_are_one_line_naming_file_and_field(tmp_path, extra, field):
    p = write_study(tmp_path, extra)
    with pytest.raises(UserError) as exc:
        load_study(p)
    msg = str(exc.value)
    assert str(p) in msg and "\n" not in msg
    if field:
        assert repr(field) in msg


def test_unknown_benchmark_and_missing_map(tmp_path):
    p = write_study(tmp_path)
    p.write_text(p.read_text().replace("arc_challenge", "arc_chalenge"))
    with pytest.raises(UserError, match=r"accuracy\.benchmarks\.arc_chalenge"):
        load_study(p)
    p = write_study(tmp_path, maps='["nope/*.json"]')
    with pytest.raises(UserError, match=r"models\[0\].maps\[0\].*matches no"):
        load_study(p)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(["study.repeats", "study.seed", "run.tokens", "run.idle_s",
                            "thermal.tolerance", "meter.emulate", "accuracy.benchmarks",
                            "study.baseline", "models"]),
       value=st.one_of(st.integers(-5, 5), st.floats(allow_nan=True), st.text(max_size=8),
                       st.booleans(), st.lists(st.integers(), max_size=2)))
def test_hostile_values_never_traceback(tmp_path_factory, key, value):
    """Any value in any field: the study loads or is refused with one line — never another
    exception."""
    d = tmp_path_factory.mktemp("s")
    (d / "base.gguf").write_bytes(b"GGUF")
    section, _, name = key.partition(".")
    doc = {"study": {"repeats": 2}, "models": [{"name": "m", "path": "base.gguf",
                                                 "maps": [str(MAPS / "uniform_q8.json")]}],
           "meter": {"emulate": True}}
    if name:
        doc.setdefault(section, {})[name] = value
    else:
        doc[section] = value
    (d / "s.toml").write_text(_toml(doc))
    try:
        load_study(d / "s.toml")
    except UserError as exc:
        assert "\n" not in str(exc) and str(d / "s.toml") in str(exc)


def _toml(doc: dict) -> str:
    def val(v: object) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float):
            return "nan" if v != v else ("inf" if v == float("inf") else
                                         "-inf" if v == float("-inf") else repr(v))
        if isinstance(v, (int,)):
            return str(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(val(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{json.dumps(k)} = {val(x)}" for k, x in v.items()) + "}"
        raise TypeError(v)

    out = []
    for section, body in doc.items():
        if isinstance(body, list) and body and all(isinstance(x, dict) for x in body):
            for item in body:
                out.append(f"[[{section}]]")
                out += [f"{k} = {val(v)}" for k, v in item.items()]
        elif isinstance(body, dict):
            out.append(f"[{section}]")
            out += [f"{k} = {val(v)}" for k, v in body.items()]
        else:
            out.insert(0, f"{section} = {val(body)}")
    return "\n".join(out) + "\n"


def test_plan_interleaves_configurations_across_rounds_in_seeded_order(tmp_path):
    s = load_study(write_study(tmp_path, repeats=4))
    plan = build_plan(s)
    runs = plan.run_steps
    configs = [c.config_id for c in plan.configs]
    assert len(runs) == 4 * len(configs)
    for k in range(1, 5):  # every round runs every configuration exactly once
        assert sorted(r.config for r in runs if r.round == k) == sorted(configs)
    # never all repeats of one configuration back to back
    seq = [r.config for r in runs]
    assert all(seq[i:i + 4] != [seq[i]] * 4 for i in range(len(seq) - 3))
    orders = {tuple(r.config for r in runs if r.round == k) for k in range(1, 5)}
    assert len(orders) > 1  # the order is drawn per round, not one fixed rotation
    # seeded: the same study gives the same plan; another seed another order
    assert [x.step_id for x in build_plan(s).steps] == [x.step_id for x in plan.steps]
    p2 = write_study(tmp_path)
    p2.write_text(p2.read_text().replace("seed = 7", "seed = 8").replace("repeats = 3",
                                                                       "repeats = 4"))
    assert [r.step_id for r in build_plan(load_study(p2)).run_steps] != [r.step_id for r
                                                                        in runs]
    kinds = [x.kind for x in plan.steps]
    assert kinds.index("accuracy") < kinds.index("run") and kinds[-2:] == ["analysis", "report"]


def test_journal_ignores_a_torn_line_and_keeps_appending_cleanly(tmp_path):
    j = Journal(tmp_path)
    j.append(Session("s.toml", None, str(tmp_path)))
    j.append(Started("run:a:1", 1, run_dir=str(tmp_path / "x")))
    j.append(Done("run:a:1", 1, {"run_dir": str(tmp_path / "x")}))
    j.append(Started("run:b:1", 1, run_dir=str(tmp_path / "y")))
    with open(j.path, "ab") as fh:  # a power cut in the middle of a line
        fh.write(b'{"event": "done", "step": "run:b:1", "res')
    st = j.read()
    assert set(st.done) == {"run:a:1"} and set(st.interrupted) == {"run:b:1"}
    assert st.torn_line and st.attempts == {"run:a:1": 1, "run:b:1": 1}
    j.append(Started("run:b:1", 2))
    st = j.read()
    assert not st.torn_line and st.attempts["run:b:1"] == 2
    lines = j.path.read_bytes().split(b"\n")
    assert all(json.loads(x) for x in lines if x)


def test_journal_edited_by_hand_is_a_one_line_error(tmp_path):
    j = Journal(tmp_path)
    j.append(Session("s.toml", None, str(tmp_path)))
    with open(j.path, "ab") as fh:
        fh.write(b"garbage\n")
    with pytest.raises(UserError, match=r"journal\.jsonl: line 2 is not JSON"):
        j.read()


class FakeMeter:
    """A /status feed: one new reading per poll at `period_s` meter seconds."""

    def __init__(self, powers: list[float], period_s: float = 0.5) -> None:
        self.powers, self.period_s, self.i, self.t = powers, period_s, 0, 0.0

    def status(self, url: str) -> dict:
        p = self.powers[min(self.i, len(self.powers) - 1)]
        t_ns = int(self.i * self.period_s * 1e9)
        self.i += 1
        return {"channels": [{"last": {"t_mono_ns": t_ns, "power_w": p - 1.0}},
                             {"last": {"t_mono_ns": t_ns, "power_w": 1.0}}]}

    def sleep(self, s: float) -> None:
        self.t += s

    def clock(self) -> float:
        return self.t


def test_settles_when_idle_power_is_stable_for_the_window():
    spec = ThermalSpec(rule="stable", tolerance=0.02, window_s=3.0, timeout_s=60, poll_s=0.5)
    # cooling: 10 W falling to 5.5 W (readings 0-9), then flat at 5.0 ± 1 % from reading 10
    powers = [10 - 0.5 * i for i in range(10)] + [5.0 + 0.05 * (-1) ** i for i in range(40)]
    m = FakeMeter(powers)
    r = settle(spec, "http://meter", status=m.status, sleep=m.sleep, clock=m.clock)
    assert r["settled"] and r["rule"] == "stable"
    # settled at the first reading whose trailing 3 s (7 readings at 0.5 s) are all flat
    assert m.i - 1 == 10 + 6
    assert r["mean_power_w"] == pytest.approx(5.0, abs=0.05)
    assert r["max_deviation"] <= 0.02


def test_times_out_and_says_so_when_power_never_settles():
    spec = ThermalSpec(rule="stable", tolerance=0.01, window_s=2.0, timeout_s=10, poll_s=0.5)
    m = FakeMeter([5.0 + (i % 2) for i in range(200)])
    r = settle(spec, "http://meter", status=m.status, sleep=m.sleep, clock=m.clock)
    assert not r["settled"] and r["waited_s"] >= 10 and "not stable" in r["reason"]


def test_stable_needs_the_whole_window():
    spec = ThermalSpec(rule="stable", tolerance=0.5, window_s=10.0)
    short = [(int(i * 1e9), 5.0) for i in range(5)]
    assert stable(short, spec)[0] is False
    full = [(int(i * 1e9), 5.0) for i in range(11)]
    assert stable(full, spec) == (True, 0.0)


def test_fixed_wait_is_recorded():
    m = FakeMeter([1.0])
    r = settle(ThermalSpec(rule="fixed", wait_s=60), "http://m", sleep=m.sleep, clock=m.clock)
    assert r == {"rule": "fixed", "wait_s": 60, "waited_s": 60.0, "settled": True}


def test_eta_learns_from_finished_steps(tmp_path):
    plan = build_plan(load_study(write_study(tmp_path)))
    now = [0.0]
    prog = Progress(plan.steps, set(), stream=io.StringIO(), clock=lambda: now[0])
    total = prog.remaining_s()
    assert total == pytest.approx(sum(s.estimate_s for s in plan.steps))
    run = plan.run_steps[0]
    prog.start(run)
    now[0] += 2 * run.estimate_s  # the first run took twice its estimate
    prog.finish(run, "x")
    left_runs = len(plan.run_steps) - 1
    others = sum(s.estimate_s for s in plan.steps if s.kind != "run")
    assert prog.remaining_s() == pytest.approx(others + left_runs * 2 * run.estimate_s)
    assert f"1/{len(plan.steps)} steps" in prog.bar()


def test_dry_run_prints_plan_and_estimate_and_writes_nothing(tmp_path):
    p = write_study(tmp_path)
    r = CliRunner().invoke(cli, ["campaign", str(p), "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "4 configurations × 3 rounds, seed 7" in r.output
    assert "run:uniform_q8:1" in r.output and "accuracy:mix_high_late" in r.output
    assert "estimate:" in r.output and "accuracy" in r.output.split("estimate:")[1]
    # projected accuracy time: 50 items × 1 s per item × 4 models = 3m20s
    assert "accuracy 3m20s" in r.output
    assert not (tmp_path / "out").exists()


def test_bad_study_on_the_command_line_is_exit_2(tmp_path):
    from epi.cli import main

    p = write_study(tmp_path, "[thermal]\nrule = \"x\"")
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "epi", "campaign", str(p), "--dry-run"],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "thermal.rule" in proc.stderr
    assert main  # the console entry point is what `-m epi` runs


def test_every_analysis_field_reaches_the_analysis_and_is_an_epi_analyze_option(tmp_path):
    """Each [analysis] field the study accepts reaches the Options the campaign analyses with,
    and is the `epi analyze` option of the same name (same value once parsed)."""
    from dataclasses import fields

    from epi.commands.analyze import analyze
    from host.campaign.study import CAMPAIGN_ACTIONS, AnalysisSpec

    written = {"energy_basis": "net", "energy_method": "trapezoid", "cv_threshold": 0.05,
               "max_offset_frac": 0.02, "min_samples": 3, "lag": "auto",
               "max_lag_error_frac": 0.02, "ppl_tolerance": 0.02, "max_resolution_frac": 0.01,
               "reference_map": "uniform_q4km", "guidance_accuracy_loss": 0.05,
               "guidance_j_budget": 1.25}
    p = write_study(tmp_path, "[analysis]\n" + "\n".join(
        f"{k} = {json.dumps(v)}" for k, v in written.items()))
    spec = load_study(p).analysis
    assert spec.given() == written
    assert set(written) == {f.name for f in fields(AnalysisSpec)} - set(CAMPAIGN_ACTIONS)
    opts = spec.options("uniform_q8")
    assert opts.baseline == "uniform_q8"
    options = {o for param in analyze.params for o in param.opts}
    for key, value in written.items():
        assert getattr(opts, key) == value
        flag = "--" + key.replace("_", "-")
        assert flag in options
        ctx = analyze.make_context("analyze", ["run", "--trace", "t", flag, str(value)])
        assert ctx.params[key] == value


@pytest.mark.parametrize(("old", "new", "field"), [
    ('name = "tiny"', 'name = "../escape"', r"models\[0\]\.name"),
    ('name = "tiny"', 'name = "/abs"', r"models\[0\]\.name"),
    ('name = "tiny"', 'name = "-x"', r"models\[0\]\.name"),
    ('name = "t"', 'name = "../../up"', r"study\.name"),
    ('name = "t"', 'name = ".hidden"', r"study\.name"),
])
def test_ids_that_become_paths_are_checked(tmp_path: Path, old: str, new: str,
                                           field: str) -> None:
    p = write_study(tmp_path)
    p.write_text(p.read_text().replace(old, new, 1))
    with pytest.raises(UserError, match=rf"{field}.*expected an id"):
        load_study(p)


def test_default_study_name_from_an_unsafe_file_name_is_refused(tmp_path: Path) -> None:
    p = write_study(tmp_path)
    odd = tmp_path / "my study.toml"
    odd.write_text(p.read_text().replace('name = "t"\n', "", 1))
    with pytest.raises(UserError, match=r"study\.name' \(default: the file's name\)"):
        load_study(odd)


def test_study_toml_falls_back_to_tomli_without_tomllib(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Python 3.10 has no tomllib: the study reader uses tomli, or says what is needed."""
    import sys
    import types

    import tomllib

    monkeypatch.setattr(sys, "version_info", (3, 10, 14, "final", 0))  # the reader asks
    monkeypatch.setitem(sys.modules, "tomllib", None)  # import tomllib → ModuleNotFoundError
    monkeypatch.setitem(sys.modules, "tomli", types.SimpleNamespace(
        loads=tomllib.loads, TOMLDecodeError=tomllib.TOMLDecodeError))
    assert load_study(write_study(tmp_path)).name == "t"
    monkeypatch.setitem(sys.modules, "tomli", None)
    with pytest.raises(UserError, match=r"needs Python 3\.11\+ or tomli"):
        load_study(write_study(tmp_path))


def test_deeply_nested_study_is_one_line(tmp_path: Path) -> None:
    p = tmp_path / "deep.toml"
    p.write_text("x = " + "[" * 100_000)
    with pytest.raises(UserError, match="not valid TOML"):
        load_study(p)


def test_a_map_measured_on_two_models_is_one_configuration_per_model(tmp_path):
    """The same maps on two models (to see whether their rank transfers): MAP.MODEL ids, each
    quantized into its model's directory under the map's own id."""
    from host.campaign.plan import configurations

    p = write_study(tmp_path, maps=f'["{MAPS}/uniform_q8.json", "{MAPS}/uniform_q4km.json"]')
    (tmp_path / "moe.gguf").write_bytes(b"GGUF")
    text = p.read_text().replace("[run]", f"""[[models]]
name = "moe"
path = "moe.gguf"
maps = ["{MAPS}/uniform_q4km.json", "{MAPS}/mix_high_late.json"]

[run]""")
    p.write_text(text)
    configs = configurations(load_study(p))
    ids = [c.config_id for c in configs]
    assert ids == ["uniform_q8", "uniform_q4km.tiny", "uniform_q4km.moe", "mix_high_late"]
    by_id = {c.config_id: c for c in configs}
    assert by_id["uniform_q4km.moe"].gguf.name == "uniform_q4km.gguf"
    assert by_id["uniform_q4km.moe"].gguf.parent.name == "moe"
