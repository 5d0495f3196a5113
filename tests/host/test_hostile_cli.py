"""Every numeric or id option of every `epi` command (the meter commands included) refuses
hostile values with one line naming the option, and `epi.cli.main` keeps its promises:
a user error exits 2 with one line, a bug exits 1 with one line and its traceback in a file."""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path

import click
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epi import cli as cli_mod
from epi.commands.params import BoundedInt, FiniteFloat, SafeId

FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
OPTION_TEXT = st.one_of(
    st.sampled_from(["nan", "NaN", "inf", "-inf", "1e308", "1e400", "-1", "0", "1", "0.5",
                     "100000", "1e3", "2.5", "", " ", "-0", "+1", "9" * 30, "0x10", "--help",
                     "-x", ".x", "../etc", "a/b", "ok_id-1.2"]),
    st.integers(min_value=-(10**12), max_value=10**12).map(str),
    st.floats().map(repr),
    st.text(max_size=8),
)


def _commands() -> list[tuple[str, click.Command]]:
    out = []
    for name, target in cli_mod.COMMANDS.items():
        module, attr = target.split(":")
        cmd = getattr(importlib.import_module(module), attr)
        stack = [(name, cmd)]
        while stack:
            path, c = stack.pop()
            out.append((path, c))
            if isinstance(c, click.Group):
                # list_commands/get_command, not .commands: a LazyGroup (`epi meter`) loads its
                # commands on demand and its .commands dict is empty.
                ctx = click.Context(c, info_name=path)
                for n in c.list_commands(ctx):
                    sub = c.get_command(ctx, n)
                    assert sub is not None, f"`epi {path} {n}` is listed but cannot be loaded"
                    stack.append((f"{path} {n}", sub))
    return out


def _leaf_names(group: click.Group, prefix: str) -> set[str]:
    """Every command path under `group`, read from its own listing (for the reachability test)."""
    names: set[str] = set()
    ctx = click.Context(group, info_name=prefix)
    for n in group.list_commands(ctx):
        sub = group.get_command(ctx, n)
        names.add(f"{prefix} {n}")
        if isinstance(sub, click.Group):
            names |= _leaf_names(sub, f"{prefix} {n}")
    return names


def _params() -> list[tuple[str, click.Parameter]]:
    return [(f"{path} {p.name}", p) for path, c in _commands() for p in c.params]


PARAMS = _params()
TYPED = [(n, p) for n, p in PARAMS if isinstance(p.type, FiniteFloat | BoundedInt | SafeId)]


def test_fuzz_reaches_every_command_lazy_groups_included() -> None:
    """The walk above reaches every command `epi --help` lists, the lazy `epi meter` group's
    subcommands included (it used to stop at the meter group, leaving its options unfuzzed)."""
    reached = {path for path, _ in _commands()}
    listed = _leaf_names(cli_mod.cli, "").__iter__()
    listed_paths = {name.strip() for name in listed}
    assert listed_paths <= reached, sorted(listed_paths - reached)
    meter = {p for p in reached if p.startswith("meter ")}
    assert {"meter run", "meter read", "meter sync", "meter calibrate"} <= meter, sorted(meter)
    meter_params = [n for n, _ in PARAMS if n.startswith("meter ")]
    assert len(meter_params) >= 16, meter_params


def test_no_bare_numeric_option_types() -> None:
    """int/float/IntRange/FloatRange accept nan, inf or unbounded values: none is left."""
    bare = [n for n, p in PARAMS
            if isinstance(p.type, click.types.IntParamType | click.types.FloatParamType)]
    assert bare == []
    assert len(TYPED) >= 25  # the suite below really covers the options


@pytest.mark.parametrize(("name", "param"), TYPED, ids=[n for n, _ in TYPED])
@FUZZ
@given(text=OPTION_TEXT)
def test_option_types_refuse_or_stay_in_range(name: str, param: click.Parameter,
                                              text: str) -> None:
    t = param.type
    try:
        value = t.convert(text, param, None)
    except click.BadParameter as exc:
        assert "\n" not in exc.format_message()
        return
    if isinstance(t, FiniteFloat):
        assert math.isfinite(value)
        assert t.lo is None or (value > t.lo if t.lo_open else value >= t.lo)
        assert t.hi is None or value <= t.hi
    elif isinstance(t, BoundedInt):
        assert type(value) is int
        assert (t.lo is None or value >= t.lo) and (t.hi is None or value <= t.hi)
    else:
        assert value[0].isalnum() and value.isascii() and "/" not in value


def _main(monkeypatch, capsys, *argv: str) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["epi", *argv])
    with pytest.raises(SystemExit) as info:
        cli_mod.main()
    return int(info.value.code or 0), capsys.readouterr().err


@pytest.mark.parametrize(("argv", "option"), [
    (["analyze", "r", "--trace", "t", "--cv-threshold", "nan"], "--cv-threshold"),
    (["analyze", "r", "--trace", "t", "--max-offset-frac", "nan"], "--max-offset-frac"),
    (["analyze", "r", "--trace", "t", "--max-resolution-frac", "inf"], "--max-resolution-frac"),
    (["analyze", "r", "--trace", "t", "--ppl-tolerance", "-1"], "--ppl-tolerance"),
    (["analyze", "r", "--trace", "t", "--max-instrument-u-pct", "nan"], "--max-instrument-u-pct"),
    (["run", "m.gguf", "--out", "o", "--threads", "100000"], "--threads"),
    (["run", "m.gguf", "--out", "o", "--cooldown-s", "nan"], "--cooldown-s"),
    (["run", "m.gguf", "--out", "o", "--idle-s", "inf"], "--idle-s"),
    (["run", "m.gguf", "--out", "o", "--map-id", "-x"], "--map-id"),
    (["run", "m.gguf", "--out", "o", "--map-id", "../up"], "--map-id"),
    (["run", "m.gguf", "--out", "o", "--map-id", ".hidden"], "--map-id"),
    (["accuracy", "m.gguf", "--ctx", "1e3"], "--ctx"),
    (["worker", "--port", "70000"], "--port"),
    (["meter", "sync", "http://127.0.0.1:9", "--timeout", "nan"], "--timeout"),
    (["meter", "sync", "http://127.0.0.1:9", "--samples", "1e3"], "--samples"),
    (["meter", "read", "--emulate", "--channels", "0"], "--channels"),
    (["meter", "calibrate", "0", "--emulate", "--readings", "inf"], "--readings"),
    (["meter", "firmware", "console", "--baud", "nan"], "--baud"),
    (["meter", "firmware", "console", "--seconds", "nan"], "--seconds"),
    (["meter", "run", "--out", "o", "--source", "rapl", "--source-node", ""], "--source-node"),
    (["meter", "run", "--out", "o", "--source-node", "a b"], "--source-node"),
])
def test_bad_option_values_exit_2_with_one_line(monkeypatch, capsys, argv, option) -> None:
    code, err = _main(monkeypatch, capsys, *argv)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"epi: error: {option}: "), err


def test_weights_nan_is_refused(monkeypatch, capsys, tmp_path: Path) -> None:
    code, err = _main(monkeypatch, capsys, "accuracy", str(tmp_path / "m.gguf"), "--weights",
                      "hellaswag=nan", "--out", str(tmp_path / "a.json"))
    assert code == 2 and "--weights" in err and "finite" in err and err.count("\n") == 1


def test_accuracy_value_nan_is_refused(monkeypatch, capsys, tmp_path: Path) -> None:
    code, err = _main(monkeypatch, capsys, "analyze", str(tmp_path), "--trace", str(tmp_path),
                      "--accuracy-value", "q4=nan", "--out", str(tmp_path / "o"))
    assert code == 2 and "--accuracy-value" in err and err.count("\n") == 1


def test_unusable_output_is_refused_before_any_work(monkeypatch, capsys, tmp_path: Path
                                                   ) -> None:
    """`epi accuracy --out DIR` fails at once, before the (missing) model is even looked at."""
    out_dir = tmp_path / "outdir"
    out_dir.mkdir()
    code, err = _main(monkeypatch, capsys, "accuracy", str(tmp_path / "missing.gguf"),
                      "--out", str(out_dir))
    assert code == 2 and "--out" in err and "is a directory" in err
    f = tmp_path / "file"
    f.write_text("")
    code, err = _main(monkeypatch, capsys, "analyze", str(tmp_path), "--trace", str(tmp_path),
                      "--out", str(f))
    assert code == 2 and "--out" in err and "not a directory" in err


boom = click.Command("boom", callback=lambda: 1 / 0)


def test_a_bug_exits_1_with_one_line_and_the_traceback_in_a_file(monkeypatch, capsys,
                                                                 tmp_path: Path) -> None:
    monkeypatch.setenv("EPI_HOME", str(tmp_path))
    monkeypatch.setitem(cli_mod.COMMANDS, "boom", f"{__name__}:boom")
    code, err = _main(monkeypatch, capsys, "boom")
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert "internal error (ZeroDivisionError" in err
    (log,) = (tmp_path / "logs").glob("crash-*.log")
    assert "Traceback" in log.read_text() and "ZeroDivisionError" in log.read_text()
    assert str(log) in err


TEXT_OPTION = st.one_of(
    st.sampled_from(["", ",", "=", "a=", "=1", "a=nan", "a=inf", "a=-1", "a=1e308", "a=0",
                     "a=1,b=2", "n0=0+1", "n0=-1", "n0=1+x", "a=0.5", "a=1=2", "n0=300"]),
    st.text(alphabet="ab=,+-.019naif ", max_size=16),
)


@FUZZ
@given(text=TEXT_OPTION)
def test_composite_options_refuse_or_parse_in_range(text: str) -> None:
    """--weights, --accuracy-value, --channels and --split: one-line refusal or sane values."""
    from epi.commands.accuracy import parse_weights
    from epi.commands.analyze import parse_accuracy_values, parse_channels
    from epi.core.errors import UserError
    from host.cluster.placement import parse_split

    def refused(fn, *args):
        try:
            return fn(*args)
        except UserError as exc:
            assert "\n" not in str(exc) and str(exc).startswith("--")
            return None

    w = refused(parse_weights, text)
    assert w is None or (all(math.isfinite(v) and v >= 0 for v in w.values())
                         and sum(w.values()) > 0)
    a = refused(parse_accuracy_values, (text,))
    assert a is None or all(0 < v <= 1 for v in a.values())
    c = refused(parse_channels, text)
    assert c is None or all(0 <= ch <= 255 for chs in c.values() for ch in chs)
    s = refused(parse_split, text, 2)
    assert s is None or all(math.isfinite(v) and v > 0 for v in s)
