"""A resumed campaign trusts nothing in its journal it has not verified on disk, and touches
nothing outside its own directory: relative journal paths, a moved copy beside
the original, steps done whose outputs are missing, hostile journal lines, two [[models]]
with one name. Fast: no step runs (the plan's steps are journaled by hand)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epi.core.errors import UserError
from host.campaign import execute
from host.campaign.execute import Campaign, dry_run
from host.campaign.journal import Done, Journal, Started
from host.campaign.layout import Layout
from host.campaign.plan import build_plan
from host.campaign.study import load_study
from host.campaign.verify import verify_done
from tests.host.test_campaign import write_study


def _finish_everything(study_path: Path) -> tuple[Path, list[str]]:
    """Journal every step of the study's plan as done, each with its output on disk (files
    stand in for models, runs and the report), as an absolute-path journal of an older epi
    would; returns the campaign directory and the run directories."""
    study = load_study(study_path)
    plan = build_plan(study)
    lay = Layout(study.out)
    j = Journal(study.out)
    root = str(study.out.resolve())
    j.path.parent.mkdir(parents=True, exist_ok=True)
    lines = [{"event": "session", "step": None, "study": str(study_path), "root": root}]
    runs = []
    for n, s in enumerate(plan.steps):
        result: dict[str, object] = {}
        if s.kind == "quantize":
            out = study.out / "models" / "tiny" / f"{s.config}.gguf"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(b"GGUF")
            result = {"output": str(out.resolve())}
        elif s.kind == "data":
            result = {"root": str(study.out.resolve()), "prepared": []}
        elif s.kind == "accuracy":
            out = study.out / "accuracy" / f"{s.config}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text("{}")
            result = {"out": str(out.resolve())}
        elif s.kind == "run":
            rd = lay.run_dir(s, 1)
            rd.mkdir(parents=True)
            (rd / "tokens.jsonl").write_text("{}\n")
            runs.append(str(rd.resolve()))
            result = {"run_dir": str(rd.resolve())}
        elif s.kind == "analysis":
            lay.analysis.mkdir(parents=True)
            (lay.analysis / "results.json").write_text("{}")
        elif s.kind == "report":
            lay.report.mkdir(parents=True)
            lay.report_html.write_text("<html></html>")
        marker = f"{root}:{s.step_id}:1"
        lines.append({"event": "started", "step": s.step_id, "attempt": 1, "pgid": 10**6 + n,
                      "marker": marker, "run_dir": result.get("run_dir")})
        lines.append({"event": "done", "step": s.step_id, "attempt": 1, "result": result})
    j.path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return study.out, runs


def test_journal_stores_paths_relative_to_the_campaign(tmp_path: Path) -> None:
    j = Journal(tmp_path / "camp")
    rd = tmp_path / "camp" / "runs" / "a" / "round1-attempt1"
    j.append(Started("run:a:1", 1, run_dir=str(rd), log=str(tmp_path / "camp" / "x.log")))
    j.append(Done("run:a:1", 1, {"run_dir": str(rd), "n_measured": 3}))
    raw = [json.loads(x) for x in j.path.read_text().splitlines()]
    assert raw[0]["run_dir"] == "runs/a/round1-attempt1" and raw[0]["log"] == "x.log"
    assert raw[1]["result"] == {"run_dir": "runs/a/round1-attempt1", "n_measured": 3}
    assert str(tmp_path) not in j.path.read_text()
    st_ = j.read()
    assert st_.done["run:a:1"].result["run_dir"] == "runs/a/round1-attempt1"


def test_a_moved_copy_leaves_the_original_untouched(tmp_path: Path) -> None:
    """An interrupted run in a copied campaign is set aside in the copy, never in the original
    the journal's absolute paths (an older epi's) name."""
    orig = tmp_path / "a"
    orig.mkdir()
    study_path = write_study(orig)
    camp, runs = _finish_everything(study_path)
    rd = Path(runs[-1])
    step = next(s for s in build_plan(load_study(study_path)).run_steps)
    # the last run step was interrupted, not done
    j = Journal(camp)
    lines = j.path.read_text().splitlines()
    lines = [x for x in lines if not (json.loads(x)["event"] == "done"
                                      and json.loads(x)["step"] in (step.step_id, "analysis",
                                                                    "report"))]
    j.path.write_text("\n".join(lines) + "\n")
    interrupted_dir = Path(next(json.loads(x)["run_dir"] for x in lines
                                if json.loads(x).get("step") == step.step_id))
    sentinel = interrupted_dir / "sentinel.txt"
    sentinel.write_text("the original's")
    before = sorted(str(p.relative_to(orig)) for p in orig.rglob("*"))

    copy = tmp_path / "b"
    shutil.copytree(orig, copy)
    study = load_study(copy / "study.toml")
    state = Journal(study.out).read()
    assert state.interrupted[step.step_id].run_dir == str(
        interrupted_dir.relative_to(camp))
    execute._clean_interrupted(state, Layout(study.out))
    assert sorted(str(p.relative_to(orig)) for p in orig.rglob("*")) == before
    assert sentinel.read_text() == "the original's"
    moved = copy / interrupted_dir.relative_to(tmp_path / "a")
    assert not moved.exists() and moved.with_name(moved.name + ".interrupted").is_dir()
    assert rd.exists()


def test_a_path_outside_the_campaign_is_never_used(tmp_path: Path) -> None:
    """A journal line naming a directory elsewhere (not under any location the journal
    recorded) is not this campaign's: not renamed, and its step is not done."""
    camp = tmp_path / "camp"
    elsewhere = tmp_path / "user" / "precious"
    elsewhere.mkdir(parents=True)
    camp.mkdir()
    (camp / "journal.jsonl").write_text(
        json.dumps({"event": "started", "step": "run:x:1", "attempt": 1,
                    "run_dir": str(elsewhere)}) + "\n"
        + json.dumps({"event": "started", "step": "run:y:1", "attempt": 1,
                      "run_dir": "../user/precious"}) + "\n")
    state = Journal(camp).read()
    assert state.interrupted["run:x:1"].run_dir is None
    assert state.interrupted["run:y:1"].run_dir is None
    execute._clean_interrupted(state, Layout(camp))
    assert elsewhere.is_dir() and not list(tmp_path.glob("user/*.interrupted*"))


def test_done_steps_whose_outputs_are_missing_run_again(tmp_path: Path) -> None:
    study_path = write_study(tmp_path)
    camp, runs = _finish_everything(study_path)
    study = load_study(study_path)
    plan = build_plan(study)
    state = Journal(camp).read()
    assert verify_done(plan, state, Layout(camp)) == []  # everything there: all trusted
    assert len(state.done) == len(plan.steps)
    shutil.rmtree(runs[0])
    (camp / "report" / "report.html").unlink()
    state = Journal(camp).read()
    lines = verify_done(plan, state, Layout(camp))
    gone = {s.step_id for s in plan.steps} - set(state.done)
    first_run = next(s.step_id for s in plan.run_steps
                     if str(Layout(camp).run_dir(s, 1).resolve()) == runs[0])
    assert gone == {first_run, "analysis", "report"}
    assert any(first_run in x and "missing" in x for x in lines)
    assert any(x.startswith("  analysis was journaled done") for x in lines)


def test_no_nothing_to_do_with_a_missing_report(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step journaled done but the report deleted: the report runs again (the old
    code said 'nothing to do' and printed the missing report's path)."""
    study_path = write_study(tmp_path)
    camp, _ = _finish_everything(study_path)
    (camp / "report" / "report.html").unlink()
    ran: list[str] = []

    def fake_report(self: Campaign, log: object) -> dict[str, str]:
        ran.append("report")
        self.layout.report_html.write_text("<html>new</html>")
        return {"out": str(self.layout.report)}

    monkeypatch.setattr(Campaign, "write_report", fake_report)
    out = io.StringIO()
    html = Campaign(load_study(study_path), stream=out).run()
    assert ran == ["report"] and html.is_file()
    assert "nothing to do" not in out.getvalue()
    assert "report was journaled done but its output" in out.getvalue()
    out2 = io.StringIO()
    assert Campaign(load_study(study_path), stream=out2).run().is_file()
    assert "nothing to do" in out2.getvalue()


def test_a_done_run_without_run_dir_is_not_done(tmp_path: Path) -> None:
    study_path = write_study(tmp_path)
    camp, _ = _finish_everything(study_path)
    plan = build_plan(load_study(study_path))
    step = plan.run_steps[0].step_id
    with open(camp / "journal.jsonl", "a") as fh:
        fh.write(json.dumps({"event": "done", "step": step, "attempt": 1, "result": {}}) + "\n")
    state = Journal(camp).read()
    lines = verify_done(plan, state, Layout(camp))
    assert step not in state.done and "analysis" not in state.done
    assert any(step in x and "names no result.run_dir" in x for x in lines)
    printed: list[str] = []
    dry_run(load_study(study_path), printed.append)
    assert any(step in x and "runs again" in x for x in printed)


@pytest.mark.parametrize(("line", "problem"), [
    ("[1, 2]", "expected an object, got list"),
    ("null", "expected an object, got NoneType"),
    ('{"event": "teleported", "step": "run:a:1"}', "'teleported' is not session"),
    ('{"event": "done", "step": null}', "field 'step'"),
    ('{"event": "done", "step": "run:a:1", "result": [1]}', "field 'result'"),
    ('{"event": "done", "step": "run:a:1", "result": {"run_dir": 5}}', "result.run_dir"),
    ('{"event": "started", "step": "run:a:1", "attempt": "2"}', "field 'attempt'"),
    ('{"event": "started", "step": "run:a:1", "attempt": 0}', "field 'attempt'"),
    ('{"event": "started", "step": "run:a:1", "pgid": true}', "field 'pgid'"),
])
def test_hostile_journal_lines_are_one_line_errors(tmp_path: Path, line: str,
                                                   problem: str) -> None:
    (tmp_path / "journal.jsonl").write_text(line + "\n")
    with pytest.raises(UserError) as exc:
        Journal(tmp_path).read()
    assert problem in str(exc.value) and "line 1" in str(exc.value)
    assert "\n" not in str(exc.value)


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                        lambda c: st.lists(c, max_size=3)
                        | st.dictionaries(st.sampled_from(
                            ["event", "step", "attempt", "pgid", "marker", "run_dir", "result",
                             "settle", "root", "rc", "reason", "log"]), c, max_size=6),
                        max_leaves=12))
def test_generated_journal_lines_never_crash(tmp_path: Path, doc: object) -> None:
    (tmp_path / "journal.jsonl").write_text(json.dumps(doc) + "\n")
    try:
        Journal(tmp_path).read()
    except UserError as exc:
        assert "\n" not in str(exc)


def test_a_journal_that_is_a_directory_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "journal.jsonl").mkdir()
    with pytest.raises(UserError, match="cannot read the journal"):
        Journal(tmp_path).read()


def test_a_lock_that_is_a_directory_is_one_line(tmp_path: Path) -> None:
    (tmp_path / execute.LOCK).mkdir(parents=True)
    with pytest.raises(UserError, match="cannot open the campaign lock"), \
            execute.campaign_lock(tmp_path):
        pass


def test_two_models_with_one_name_are_refused(tmp_path: Path) -> None:
    p = write_study(tmp_path, f"""
[[models]]
name = "tiny"
path = "other.gguf"
maps = ["{Path(__file__).resolve().parents[2] / 'quantmaps' / 'uniform_q4km.json'}"]
""")
    text = p.read_text()
    with pytest.raises(UserError, match=r"models\[1\]\.name.*already the name of models\[0\]"):
        load_study(p)
    assert text.count("[[models]]") == 2


@pytest.mark.parametrize(("extra", "field"), [
    ("[run]\nthreads = 100000", r"run\.threads.*at most 1024"),
    ("[accuracy]\nthreads = 100000", r"accuracy\.threads"),
    ("[run]\ntokens = 8\nwarmups = 100000", r"run\.warmups"),
    ("[run]\ntokens = 8\nidle_s = 1e12", r"run\.idle_s"),
    ("[thermal]\nwait_s = 1e300", r"thermal\.wait_s"),
    ("[meter]\nemulate = true\nrate_hz = 1e9", r"meter\.rate_hz"),
])
def test_values_far_out_of_range_are_refused(tmp_path: Path, extra: str, field: str) -> None:
    p = write_study(tmp_path)
    text = p.read_text()
    section = extra.split("\n", 1)[0]
    if section in text:  # replace the section the helper already writes
        start = text.index(section)
        end = text.find("\n[", start + 1)
        text = text[:start] + extra + "\n" + (text[end + 1:] if end >= 0 else "")
    else:
        text += extra + "\n"
    p.write_text(text)
    with pytest.raises(UserError, match=field) as exc:
        load_study(p)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("key", ["repeats", "seed"])
def test_huge_study_repeats_and_seed_are_refused_not_planned(tmp_path: Path, key: str) -> None:
    """Repeats at 2**63 used to hang building the plan."""
    p = write_study(tmp_path)
    p.write_text(p.read_text().replace("seed = 7", "seed = 7" if key != "seed" else
                                       f"seed = {2**63 - 1}").replace(
        "repeats = 3", f"repeats = {2**63 - 1}" if key == "repeats" else "repeats = 3"))
    with pytest.raises(UserError, match=rf"study\.{key}.*at most"):
        load_study(p)


def test_the_same_map_twice_is_refused(tmp_path: Path) -> None:
    maps_dir = Path(__file__).resolve().parents[2] / "quantmaps"
    p = write_study(tmp_path, maps=f'["{maps_dir}/uniform_q8.json", "{maps_dir}/uniform_q8.json"]')
    with pytest.raises(UserError, match=r"models\[0\]\.maps.*listed twice"):
        load_study(p)
    p = write_study(tmp_path, maps=f'["{maps_dir}/uniform_q8.json", "{maps_dir}/uniform_q*.json"]')
    with pytest.raises(UserError, match="listed twice"):
        load_study(p)


@pytest.mark.parametrize("status", [
    [], None, {"channels": None}, {"channels": [None, 3, "x"]},
    {"channels": [{"last": {"t_mono_ns": "1", "power_w": 2.0}}]},
    {"channels": [{"last": {"t_mono_ns": 1, "power_w": float("nan")}}]},
    {"channels": [{"last": {"t_mono_ns": 1, "power_w": True}}]},
])
def test_a_malformed_meter_status_is_no_reading(status: object) -> None:
    """A /status answer not of the daemon's shape is 'no reading yet' (the settle then times
    out and says so), never a crash of the campaign."""
    from host.campaign.thermal import total_power

    assert total_power(status) is None


def test_meter_status_sums_the_channels_newest_time() -> None:
    from host.campaign.thermal import total_power

    status = {"channels": [{"last": {"t_mono_ns": 5, "power_w": 1.5}},
                           {"last": {"t_mono_ns": 7, "power_w": 2.25}}, {"last": None}]}
    assert total_power(status) == (7, 3.75)


def _fingerprint(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every path under root with its mode, mtime (ns) and bytes (files) — a rename, a write
    or a deletion anywhere changes it."""
    out: dict[str, tuple[int, int, bytes]] = {}
    for p in sorted(root.rglob("*")):
        st_ = p.lstat()
        out[str(p.relative_to(root))] = (st_.st_mode, st_.st_mtime_ns,
                                         p.read_bytes() if p.is_file() else b"")
    return out


def test_a_moved_copy_never_counts_or_touches_the_original(tmp_path: Path) -> None:
    """A campaign moved beside its original (absolute-path journal of an older epi): the
    copy's resume checks (verify_done, setting interrupted runs aside) read and change only
    the copy. An output deleted in the copy is not made 'done' by the original's file that the
    journal's absolute path still names, and the original, a sentinel in it included, stays
    byte for byte and mtime for mtime as it was."""
    orig = tmp_path / "a"
    orig.mkdir()
    study_path = write_study(orig)
    camp, runs = _finish_everything(study_path)
    (camp / "sentinel.txt").write_text("the user's file in the original campaign")
    moved = tmp_path / "a-moved"
    shutil.copytree(orig, moved)
    before = _fingerprint(orig)
    study = load_study(moved / "study.toml")
    plan = build_plan(study)
    copy_run = study.out / Path(runs[0]).relative_to(camp)
    shutil.rmtree(copy_run)  # gone in the copy only: the original's is still there
    state = Journal(study.out).read()
    lines = verify_done(plan, state, Layout(study.out))
    first_run = next(s.step_id for s in plan.run_steps
                     if str(Layout(camp).run_dir(s, 1).resolve()) == runs[0])
    assert first_run not in state.done and any(first_run in x for x in lines), lines
    assert all(f"{orig}/" not in x for x in lines), lines  # nothing of the original named
    execute._clean_interrupted(state, Layout(study.out))
    assert _fingerprint(orig) == before
