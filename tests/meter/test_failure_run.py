"""The failing-channel run shared by the sampler, the bridge recorder and the counters."""

from meter.recording.failure_run import FailureRun


def test_a_run_opens_at_its_first_failure_and_counts_reasons_in_order() -> None:
    run = FailureRun()
    assert run.close() is None  # no run open: nothing to declare
    assert run.book(10, 1010, "bus_error") is True
    assert run.book(20, 1020, "absent") is False
    assert run.book(30, 1030, "bus_error") is False
    assert run.failing
    closed = run.close()
    assert closed is not None
    assert (closed.start_mono_ns, closed.start_real_ns) == (10, 1010)
    assert closed.counts_text() == "bus_error ×2, absent ×1"
    assert closed.failures == 3
    assert not run.failing and run.close() is None


def test_a_new_run_after_a_close_starts_afresh() -> None:
    run = FailureRun()
    run.book(1, 2, "absent")
    run.close()
    assert run.book(50, 60, "implausible") is True
    closed = run.close()
    assert closed is not None
    assert closed.start_mono_ns == 50 and closed.counts == {"implausible": 1}
