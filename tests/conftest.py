"""Shared fixtures: a tiny random-weight llama GGUF made on the fly (no downloads)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# Generated hostile input, reproducibly: under CI (CI=true, as .ci/run is started) every
# hypothesis test draws the same examples each run (derandomize), so a red CI is the code's
# doing, not the draw's. Elsewhere the draws vary (more ground covered over many runs); a
# failure prints the blob that replays it (@reproduce_failure) and is kept in the local
# example database. HYPOTHESIS_PROFILE=ci reproduces CI's draws on any machine.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE")
                      or ("ci" if os.environ.get("CI") else "dev"))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An 8-layer, 256-wide random llama GGUF (F16) with a real SPM tokenizer."""
    from host.quant.tiny_model import write_test_model

    out = tmp_path_factory.mktemp("tiny") / "tiny-llama-f16.gguf"
    write_test_model(out)
    return out


# Timing-sensitive files (rates, deadlines, loopback round trips, CPU time of real processes):
# scripts/run_tests.sh runs them in its serial pass, never beside another test on the 2 cores
# (the `slow` tests run there too). A new such file is added here.
SERIAL_FILES = frozenset({
    "tests/host/test_align_groundtruth.py",
    "tests/host/test_multi_meter.py",
    "tests/host/test_runner.py",
    "tests/meter/test_clocksync.py",
    "tests/meter/test_daemon.py",
    "tests/meter/test_daemon_storage.py",
    "tests/meter/test_grafana_dashboard.py",
    "tests/meter/test_process_tree_model.py",
    "tests/meter/test_sampler.py",
    "tests/meter/test_sampler_selfcheck.py",
    "tests/meter/test_stream_clients.py",
})
_ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test of SERIAL_FILES `serial`."""
    for item in items:
        if item.path.relative_to(_ROOT).as_posix() in SERIAL_FILES:
            item.add_marker(pytest.mark.serial)
