"""Every reporting command's `--json` output validates against its documented schema
(docs/schemas/), and says what the text output says."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is in the dev extra")

REPO = Path(__file__).resolve().parents[1]
SCHEMAS = REPO / "docs" / "schemas"


def validate(doc: object, name: str) -> None:
    schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(doc, schema)


def _epi(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "epi", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=120)


def test_doctor_json_validates_and_agrees_with_the_text() -> None:
    doc = json.loads(_epi("doctor", "--role", "all", "--json").stdout)
    validate(doc, "epi-doctor")
    text = _epi("doctor", "--role", "all").stdout
    missing = [c["item"] for c in doc["checks"] if c["ok"] is False and c["needed_by"]]
    assert doc["missing_for_role"] == missing
    assert f"{len(missing)} missing for the all role" in text


def test_campaign_plan_json_validates_and_agrees_with_the_text() -> None:
    import re
    import tempfile

    study = str(REPO / "examples" / "study-demo.toml")
    with tempfile.TemporaryDirectory() as out:  # a fresh campaign directory: nothing done yet
        proc = _epi("campaign", study, "--dry-run", "--json", "--out", out)
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        text = _epi("campaign", study, "--dry-run", "--out", out).stdout
    validate(doc, "epi-campaign-plan")
    step_lines = [line for line in text.splitlines() if re.match(r"^ [ *]\s*\d+\. ", line)]
    assert len(step_lines) == len(doc["steps"])
    for line, step in zip(step_lines, doc["steps"], strict=True):
        assert step["step_id"] in line
    assert doc["estimate_left_s"] == pytest.approx(
        sum(s["estimate_s"] or 0.0 for s in doc["steps"] if not s["done"]))


def test_a_schema_refuses_what_it_should() -> None:
    """Break it once: a document the schema must refuse is refused."""
    doc = json.loads(_epi("doctor", "--role", "analysis", "--json").stdout)
    doc["role"] = "toaster"
    with pytest.raises(jsonschema.ValidationError):
        validate(doc, "epi-doctor")



def test_meter_plan_json_validates_and_agrees_with_the_text() -> None:
    board = str(REPO / "hardware" / "epi-meter.toml")
    proc = _epi("meter", "plan", board, "--load-w", "2.7..9.5", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    validate(doc, "epi-meter-plan")
    text = _epi("meter", "plan", board, "--load-w", "2.7..9.5").stdout
    for ch in doc["channels"]:
        assert f"channel {ch['chain']['name']}:" in text
        for load in ch["loads"]:
            assert f"at {load['load_w']:g} W" in text


def test_meter_qualify_json_is_the_saved_document(tmp_path: Path) -> None:
    out = tmp_path / "q.json"
    proc = _epi("meter", "qualify", "--emulate", "--channels", "2", "--step-s", "2",
                "--inject", "gain:1=0.03", "--out", str(out), "--json")
    doc = json.loads(proc.stdout)
    validate(doc, "epi-meter-qualification")
    assert doc == json.loads(out.read_text())
    assert proc.returncode == (0 if doc["passed"] else 1)
    assert [c["passed"] for c in doc["channels"]] == [True, False]  # the injected 3 % gain
