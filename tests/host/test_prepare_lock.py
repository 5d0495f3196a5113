"""One-time preparations that two processes start at once take turns (`one_at_a_time`): the
model's (`prepare_model`) runs once and the second caller gets the first's result, instead of
both writing the same temporary files. Threads stand in for processes: `flock` locks belong
to an open file, so two opens of the lock file exclude each other within one process too.
Every wait below is on an event with a timeout, never on a sleep: a loaded machine only makes
the test slower."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from epi.core.errors import UserError
from epi.core.files import one_at_a_time, write_json_atomic
from epi.formats.manifests import ModelManifest
from host.quant import models

TIMEOUT_S = 60


def test_a_second_holder_waits_until_the_first_lets_go(tmp_path: Path) -> None:
    lock = tmp_path / "sub" / ".x.lock"
    held, release, waited = threading.Event(), threading.Event(), threading.Event()
    order: list[str] = []

    def first() -> None:
        with one_at_a_time(lock):
            order.append("first in")
            held.set()
            assert release.wait(TIMEOUT_S)
            order.append("first out")

    def second() -> None:
        with one_at_a_time(lock, waited.set):
            order.append("second in")

    a = threading.Thread(target=first)
    a.start()
    assert held.wait(TIMEOUT_S)
    b = threading.Thread(target=second)
    b.start()
    assert waited.wait(TIMEOUT_S)  # told it waits, and not inside yet
    assert order == ["first in"]
    release.set()
    a.join(TIMEOUT_S)
    b.join(TIMEOUT_S)
    assert order == ["first in", "first out", "second in"]


def test_a_free_lock_is_taken_without_waiting(tmp_path: Path) -> None:
    calls: list[str] = []
    with one_at_a_time(tmp_path / ".x.lock", lambda: calls.append("waited")):
        pass
    with one_at_a_time(tmp_path / ".x.lock", lambda: calls.append("waited")):
        pass
    assert calls == []


def test_an_unwritable_lock_place_is_one_user_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with (pytest.raises(UserError, match=r"file/\.x\.lock: cannot open the lock file"),
          one_at_a_time(blocker / ".x.lock")):
        pass


def test_two_model_preparations_at_once_prepare_it_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPI_HOME", str(tmp_path))
    entered, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def fake_prepare(name: str, src: object, out: Path, log: object) -> ModelManifest:
        calls.append(name)
        entered.set()
        assert release.wait(TIMEOUT_S)  # held until the other caller is waiting on the lock
        out.write_bytes(b"GGUF" + bytes(60))
        manifest = ModelManifest(size_bytes=64, n_params=1, n_layers=1, name=name)
        write_json_atomic(out.with_suffix(".manifest.json"), manifest.to_json())
        return manifest

    monkeypatch.setattr(models, "_prepare", fake_prepare)
    got: list[ModelManifest] = []

    def prepare(log: object) -> None:
        got.append(models.prepare_model("smollm2", log=log))  # type: ignore[arg-type]

    a = threading.Thread(target=prepare, args=(lambda line: None,))
    a.start()
    assert entered.wait(TIMEOUT_S)
    lines: list[str] = []

    def second_log(line: str) -> None:
        lines.append(line)
        if "another process is preparing it" in line:
            release.set()

    b = threading.Thread(target=prepare, args=(second_log,))
    b.start()
    a.join(TIMEOUT_S)
    b.join(TIMEOUT_S)
    assert calls == ["smollm2"]  # the second found the first's model
    assert len(got) == 2 and got[0].size_bytes == got[1].size_bytes == 64
    assert any("already prepared" in line for line in lines)
