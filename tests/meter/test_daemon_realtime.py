"""The sampler thread's real-time scheduling (meter/daemon/realtime.py): applied to the
calling thread only, restored afterwards, and a clear note where the system refuses it."""

from __future__ import annotations

import os
import threading

import pytest

from meter.daemon.realtime import realtime_sampling

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setscheduler"),
                                reason="no sched_setscheduler on this platform")


def _in_thread(fn):
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(fn()))
    t.start()
    t.join(10)
    return out


def test_fifo_for_the_calling_thread_only_and_restored():
    main_policy = os.sched_getscheduler(0)

    def body():
        before = os.sched_getscheduler(0)
        with realtime_sampling() as note:
            inside = os.sched_getscheduler(0)
            main_inside = os.sched_getscheduler(threading.main_thread().native_id)
        return {"before": before, "inside": inside, "after": os.sched_getscheduler(0),
                "note": note, "main_inside": main_inside}

    r = _in_thread(body)
    assert r["after"] == r["before"]
    assert r["main_inside"] == main_policy  # other threads keep their policy
    if "SCHED_FIFO 10" in r["note"]:
        assert r["inside"] == os.SCHED_FIFO
    else:  # not permitted here: said so, and nothing changed
        assert "normal priority" in r["note"] and r["inside"] == r["before"]


def test_refusal_is_a_note_not_an_error(monkeypatch):
    def refuse(*_args):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    with realtime_sampling() as note:
        assert note.startswith("sampler at normal priority (SCHED_FIFO refused: "
                               "Operation not permitted)")
