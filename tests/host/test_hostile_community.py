"""Hostile input to the community readers and options: a summary, a hardware file, a
submission directory and `--lab`/`--study` values from hypothesis are read or refused
with one line; never a traceback. The summary `epi submit` writes follows the JSON Schema."""

from __future__ import annotations

import json
import shutil
from dataclasses import fields
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epi.core.errors import UserError
from host.bundle import archive
from host.community.check import check
from host.community.make import read_hardware
from host.community.record import SCHEMA, ConfigFigures, Hardware, Protocol, Submission
from tests.cli_run import run_epi
from tests.host.test_community import community, labs  # noqa: F401  (module fixtures)

FUZZ = settings(max_examples=30, deadline=None,
                suppress_health_check=[HealthCheck.too_slow,
                                       HealthCheck.function_scoped_fixture])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                    st.text(max_size=12))
JSON = st.recursive(SCALARS, lambda kids: st.one_of(
    st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=8), kids, max_size=4)),
    max_leaves=12)


def _one_line(exc: UserError) -> None:
    assert str(exc) and "\n" not in str(exc)


def _paths(doc: object, prefix: tuple = ()) -> list[tuple]:  # type: ignore[type-arg]
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def _valid(community: Path) -> str:  # noqa: F811
    return (community / "labB" / "s1" / "summary.json").read_text()


def test_the_written_summary_follows_the_schema_and_the_schema_the_record(
        community: Path) -> None:  # noqa: F811
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA.read_text())
    for lab in ("A", "B"):
        jsonschema.validate(json.loads((community / f"lab{lab}" / "s1" / "summary.json")
                                       .read_text()), schema)
    props = schema["properties"]
    assert set(schema["required"]) - {"format", "format_version"} == {
        f.name for f in fields(Submission)}
    assert set(props["hardware"]["required"]) == {f.name for f in fields(Hardware)}
    assert set(props["protocol"]["required"]) == {f.name for f in fields(Protocol)}
    assert set(props["configs"]["items"]["required"]) == {f.name for f in fields(ConfigFigures)}
    sub = Submission.from_json(_valid(community), "x")
    assert Submission.from_json(sub.to_json(), "x") == sub


@FUZZ
@given(doc=JSON)
def test_any_json_as_a_summary_is_read_or_one_line(doc: object) -> None:
    try:
        Submission.from_json(json.dumps(doc), "s.json")
    except UserError as exc:
        _one_line(exc)


@FUZZ
@given(data=st.data(), value=JSON)
def test_a_summary_with_one_field_replaced_is_read_or_one_line(
        community: Path, data: st.DataObject, value: object) -> None:  # noqa: F811
    doc = json.loads(_valid(community))
    path = data.draw(st.sampled_from(_paths(doc)[1:]))
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    try:
        Submission.from_json(json.dumps(doc), "s.json")
    except UserError as exc:
        _one_line(exc)


@FUZZ
@given(doc=JSON, text=st.text(max_size=40))
def test_any_hardware_file_is_read_or_one_line(community: Path, tmp_path_factory,  # noqa: F811
                                               doc: object, text: str) -> None:
    bundle = archive.read(community / "labA" / "s1" / "s1.epi-bundle.tar.gz")
    d = tmp_path_factory.mktemp("hw")
    for content in (json.dumps(doc), text):
        (d / "hw.json").write_text(content)
        try:
            read_hardware(d / "hw.json", bundle)
        except UserError as exc:
            _one_line(exc)
            assert "--hardware" in str(exc)


@FUZZ
@given(text=st.one_of(JSON.map(json.dumps), st.text(max_size=60)))
def test_any_summary_text_gives_the_checker_lines_never_a_traceback(
        community: Path, tmp_path_factory, text: str) -> None:  # noqa: F811
    d = tmp_path_factory.mktemp("sub")
    shutil.copy(community / "labA" / "s1" / "s1.epi-bundle.tar.gz", d)
    (d / "summary.json").write_text(text)
    problems = check(d)
    assert problems and all(p and "\n" not in p for p in problems)


@FUZZ
@given(name=st.one_of(st.sampled_from(["", "..", "../x", "a/b", "-x", ".x", "ok", "a" * 70,
                                       "lab 1", "é"]), st.text(max_size=10)))
def test_lab_and_study_options_are_used_or_one_line(
        community: Path, labs: dict[str, Path], tmp_path_factory,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        name: str) -> None:
    d = tmp_path_factory.mktemp("lab")
    hw = d / "hw.json"
    hw.write_text(json.dumps({"board": "b", "cpu": "c", "memory_gb": 1, "os": "o",
                              "thermal": "t"}))
    if name.startswith("-"):
        name = "=" + name  # as the option's value, not an option
    for option in ("--lab", "--study"):
        code, _, err = run_epi(monkeypatch, capsys, "submit", str(labs["A"]), "--out",
                               str(d / option.strip("-")), "--hardware", str(hw),
                               f"{option}={name}")
        assert code in (0, 2), err
        if code == 2:
            assert err.strip() and err.strip().count("\n") == 0


def test_site_of_a_hostile_tree_is_one_line_per_left_out_submission(
        community: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "data"
    for bad, text in (("x", "{"), ("y", "[]"), ("z", json.dumps({"format": 1}))):
        (root / bad / "s").mkdir(parents=True)
        (root / bad / "s" / "summary.json").write_text(text)
    code, out, err = run_epi(monkeypatch, capsys, "site", str(root), "--out",
                             str(tmp_path / "site"))
    assert code == 0, err
    assert out.count("left out:") == 3 and "0 submission(s)" in out
    code, _, err = run_epi(monkeypatch, capsys, "site", str(tmp_path / "nope"), "--out",
                           str(tmp_path / "site"))
    assert code == 2 and err.strip().count("\n") == 0


@FUZZ
@given(name=st.text(min_size=1, max_size=20).filter(lambda s: "\x00" not in s))
def test_check_submission_of_a_path_that_is_no_submission_is_one_line(
        tmp_path_factory, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], name: str) -> None:
    d = tmp_path_factory.mktemp("none")
    code, _, err = run_epi(monkeypatch, capsys, "check-submission", str(d / name))
    assert code == 2
    assert err.strip() and err.strip().count("\n") == 0


def test_a_summary_whose_lab_is_a_path_is_refused(community: Path) -> None:  # noqa: F811
    """The lab and study name the site's page files: a path in them is refused."""
    doc = json.loads(_valid(community))
    for bad in ("../../x", "a/b", ".hidden", ""):
        doc["lab"] = bad
        with pytest.raises(UserError, match="lab: "):
            Submission.from_json(json.dumps(doc), "s.json")
