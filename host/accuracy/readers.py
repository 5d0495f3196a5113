"""Read benchmark data from the standard files people have, and write llama.cpp task files.

Accepted inputs (a directory means every accepted file under it, in sorted path order):
- Hugging Face `datasets` files: Arrow (`.arrow`, IPC stream or file), Parquet (`.parquet`),
  JSON Lines (`.jsonl`, `.jsonl.gz`, or `.json` holding lines or one array);
- llama.cpp's task files: HellaSwag text (`.txt`, 6 lines per task), WinoGrande CSV
  (`.csv`: index,sentence,option1,option2,answer) and the binary multiple-choice format
  (`.bin`, as read by `llama-perplexity --multiple-choice`).

Every problem is a `UserError` naming the file, the row and the field.
"""

from __future__ import annotations

import gzip
import json
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path

from epi.core.errors import UserError
from host.accuracy.items import (
    BENCHMARKS,
    CONVERTERS,
    Benchmark,
    Item,
    shared_item,
    winogrande_from_parts,
)
from host.errors import RecordError

#: the most answers llama.cpp reads for one task of its binary multiple-choice file
MAX_ANSWERS = 100

TABLE_SUFFIXES = (".arrow", ".parquet", ".jsonl", ".jsonl.gz", ".json")
LLAMA_SUFFIXES = (".txt", ".csv", ".bin")
# metadata that HF `save_to_disk` writes next to the Arrow files: not data
HF_METADATA = ("dataset_info.json", "state.json", "dataset_dict.json")


def _suffix(path: Path) -> str:
    name = path.name.lower()
    for s in TABLE_SUFFIXES + LLAMA_SUFFIXES:
        if name.endswith(s):
            return s
    return path.suffix.lower()


def data_files(path: Path) -> list[Path]:
    """The data files a path stands for (itself, or the accepted files under a directory)."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: data file not found (run `epi data prepare`)")
    if path.is_dir():
        files = sorted(
            p
            for p in path.rglob("*")
            if p.is_file()
            and _suffix(p) in TABLE_SUFFIXES + LLAMA_SUFFIXES
            and p.name not in HF_METADATA
        )
        if not files:
            raise UserError(f"{path}: no data files (.arrow, .parquet, .jsonl, .txt, .csv, .bin)")
        return files
    if _suffix(path) not in TABLE_SUFFIXES + LLAMA_SUFFIXES:
        raise UserError(
            f"{path}: unknown data file type {path.suffix!r} "
            "(expected .arrow, .parquet, .jsonl, .json, .txt, .csv or .bin)"
        )
    return [path]


def read_table(path: Path) -> list[dict[str, object]]:
    """Records of one HF-datasets file (Arrow, Parquet or JSON Lines)."""
    suffix = _suffix(path)
    try:
        if suffix == ".arrow":
            import pyarrow as pa

            try:
                with pa.ipc.open_stream(path) as reader:
                    return reader.read_all().to_pylist()
            except pa.ArrowInvalid:
                with pa.ipc.open_file(path) as reader:
                    return reader.read_all().to_pylist()
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path).to_pylist()
    except UserError:
        raise
    except Exception as exc:  # pyarrow raises many types for a damaged file
        raise UserError(f"{path}: not a readable {suffix} file ({_one_line(exc)})") from exc
    return _read_json_lines(path)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _read_json_lines(path: Path) -> list[dict[str, object]]:
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read as UTF-8 JSON ({_one_line(exc)})") from exc
    if text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}: malformed JSON ({exc.msg} at line {exc.lineno})") from exc
        except RecursionError:
            raise UserError(f"{path}: malformed JSON (nested too deeply)") from None
    else:
        records = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}: line {n}: malformed JSON ({exc.msg})") from exc
            except RecursionError:
                raise UserError(f"{path}: line {n}: malformed JSON (nested too deeply)") from None
    for n, rec in enumerate(records, 1):
        if not isinstance(rec, dict):
            raise UserError(f"{path}: record {n}: expected a JSON object")
    return records


def read_hellaswag_txt(path: Path) -> list[Item]:
    """llama.cpp's HellaSwag task file: context, gold index, 4 endings — 6 lines per task."""
    text = _read_text(path)
    if text.endswith("\n"):
        text = text[:-1]  # llama-perplexity drops one trailing newline too
    lines = text.split("\n")
    if len(lines) % 6:
        raise UserError(f"{path}: {len(lines)} lines is not a multiple of 6 (HellaSwag task file)")
    items = []
    for t in range(len(lines) // 6):
        ctx, label, *endings = lines[6 * t : 6 * t + 6]
        try:
            gold = int(label)
            items.append(shared_item(f"task{t}", ctx, endings, gold))
        except (ValueError, RecordError) as exc:
            raise UserError(f"{path}: line {6 * t + 2}: field 'label': bad task ({exc})") from exc
    return items


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read as UTF-8 text ({_one_line(exc)})") from exc


def _split_winogrande_line(line: str) -> list[str] | None:
    """llama.cpp's CSV rule: the first four commas outside double quotes split five fields."""
    commas, quoted = [], False
    for i, ch in enumerate(line):
        if ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            commas.append(i)
            if len(commas) == 4:
                break
    if len(commas) != 4:
        return None
    bounds = [-1, *commas, len(line)]
    fields = [line[bounds[k] + 1 : bounds[k + 1]] for k in range(5)]
    if len(fields[1]) >= 2 and fields[1].startswith('"') and fields[1].endswith('"'):
        fields[1] = fields[1][1:-1]
    return fields


def read_winogrande_csv(path: Path) -> list[Item]:
    """llama.cpp's WinoGrande CSV (index,sentence,option1,option2,answer; header optional)."""
    items = []
    for n, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        fields = _split_winogrande_line(line)
        if fields is None:
            raise UserError(f"{path}: line {n}: expected 5 comma-separated fields")
        index, sentence, opt1, opt2, answer = fields
        if n == 1 and answer.strip().lower() == "answer":
            continue  # header
        if answer.strip() not in ("1", "2"):
            raise UserError(f"{path}: line {n}: field 'answer': expected 1 or 2, got {answer!r}")
        try:
            items.append(
                winogrande_from_parts(f"task{index}", sentence, [opt1, opt2], int(answer) - 1)
            )
        except RecordError as exc:
            raise UserError(f"{path}: line {n}: {exc}") from exc
    return items


def _read_string(buf: bytes, pos: int) -> tuple[str, int]:
    (size,) = struct.unpack_from("<I", buf, pos)
    pos += 4
    if pos + size > len(buf):
        raise ValueError("string runs past the end of the file")
    return buf[pos : pos + size].decode("utf-8"), pos + size


def _read_answers(buf: bytes, pos: int) -> tuple[list[str], list[int], int]:
    (n,) = struct.unpack_from("<I", buf, pos)
    pos += 4
    if n > MAX_ANSWERS:
        raise ValueError(f"{n} answers (llama.cpp allows at most {MAX_ANSWERS})")
    answers = []
    for _ in range(n):
        a, pos = _read_string(buf, pos)
        answers.append(a)
    labels = list(struct.unpack_from(f"<{n}i", buf, pos))
    return answers, labels, pos + 4 * n


def read_multiple_choice_bin(path: Path) -> list[Item]:
    """llama.cpp's binary multiple-choice file (question, answers, labels; mc2 ignored)."""
    buf = path.read_bytes()
    items = []
    try:
        (n_task,) = struct.unpack_from("<I", buf, 0)
        if n_task == 0:
            raise ValueError("no tasks")
        positions = struct.unpack_from(f"<{n_task}I", buf, 4)
        for t, pos in enumerate(positions):
            question, p = _read_string(buf, pos)
            answers, labels, p = _read_answers(buf, p)
            _read_answers(buf, p)  # mc2: multiple correct answers, not scored (as llama.cpp)
            if labels.count(1) != 1:
                raise ValueError(f"task {t}: expected exactly one correct answer")
            items.append(shared_item(f"task{t}", question, answers, labels.index(1)))
    except (struct.error, ValueError, UnicodeDecodeError, RecordError) as exc:
        raise UserError(f"{path}: malformed multiple-choice task file ({exc})") from exc
    return items


def write_hellaswag_txt(items: Sequence[Item], path: Path) -> Path:
    """llama.cpp's HellaSwag task file for `items` (4 shared-context choices each)."""
    lines = []
    for it in items:
        if it.partial or it.n_choices != 4 or not all(k.startswith(" ") for k in it.continuations):
            raise UserError(f"item {it.id}: not a 4-choice shared-context item")
        texts = [it.contexts[0], str(it.gold), *(k[1:] for k in it.continuations)]
        if any("\n" in s for s in texts):
            raise UserError(f"item {it.id}: a newline inside a HellaSwag line")
        lines.extend(texts)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _pack_string(s: str) -> bytes:
    raw = s.encode("utf-8")
    return struct.pack("<I", len(raw)) + raw


def write_multiple_choice_bin(items: Sequence[Item], path: Path) -> Path:
    """llama.cpp's binary multiple-choice task file for shared-context `items`."""
    blobs = []
    for it in items:
        if it.partial or not all(k.startswith(" ") for k in it.continuations):
            raise UserError(f"item {it.id}: not a shared-context item")
        n = it.n_choices
        if n > MAX_ANSWERS:
            raise UserError(f"item {it.id}: {n} choices; llama.cpp's multiple-choice task file "
                            f"holds at most {MAX_ANSWERS}")
        labels = [1 if i == it.gold else 0 for i in range(n)]
        blob = _pack_string(it.contexts[0]) + struct.pack("<I", n)
        blob += b"".join(_pack_string(k[1:]) for k in it.continuations)
        blob += struct.pack(f"<{n}i", *labels) + struct.pack("<I", 0)
        blobs.append(blob)
    header = 4 + 4 * len(blobs)
    positions, pos = [], header
    for b in blobs:
        positions.append(pos)
        pos += len(b)
    data = struct.pack(f"<I{len(blobs)}I", len(blobs), *positions) + b"".join(blobs)
    path.write_bytes(data)
    return path


def _records_to_items(
    bench: str, path: Path, records: list[dict[str, object]], row0: int
) -> Iterator[Item]:
    convert = CONVERTERS[bench]
    for i, rec in enumerate(records):
        try:
            yield convert(rec, row0 + i)
        except RecordError as exc:
            raise UserError(f"{path}: row {i + 1}: {exc} ({bench})") from exc


def load_items(bench: str, paths: Sequence[Path]) -> list[Item]:
    """All items of `bench` in the given files/directories, in file order."""
    if bench not in BENCHMARKS:
        raise UserError(f"unknown benchmark {bench!r} (known: {', '.join(BENCHMARKS)})")
    items: list[Item] = []
    for root in paths:
        for path in data_files(Path(root)):
            suffix = _suffix(path)
            if suffix == ".txt":
                if bench != Benchmark.HELLASWAG:
                    raise UserError(
                        f"{path}: a .txt task file is llama.cpp's HellaSwag format, not {bench}"
                    )
                items.extend(read_hellaswag_txt(path))
            elif suffix == ".csv":
                if bench != Benchmark.WINOGRANDE:
                    raise UserError(
                        f"{path}: a .csv task file is llama.cpp's WinoGrande format, not {bench}"
                    )
                items.extend(read_winogrande_csv(path))
            elif suffix == ".bin":
                if bench == Benchmark.WINOGRANDE:
                    raise UserError(
                        f"{path}: WinoGrande needs partial scoring; use the .csv or HF file"
                    )
                items.extend(read_multiple_choice_bin(path))
            else:
                items.extend(_records_to_items(bench, path, read_table(path), len(items)))
    if not items:
        raise UserError(f"{', '.join(map(str, paths))}: no {bench} items in the data")
    return items
