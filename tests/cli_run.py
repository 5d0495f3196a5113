"""The real `epi` entry point run in-process, for tests that drive commands end to end."""

from __future__ import annotations

import sys

import pytest


def run_epi(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
            ) -> tuple[int, str, str]:
    """Run `epi ARGS...` through `epi.cli.main`; (exit code, stdout, stderr)."""
    from epi.cli import main

    monkeypatch.setattr(sys, "argv", ["epi", *args])
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err
