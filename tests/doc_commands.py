"""Run a document's console commands in order, so a walk-through cannot rot.

Every ```console block of the page is read; each `$ ` line (with `\\` continuations) is a
command, the lines after it up to the next command are what the page says it prints. The
commands run in one scratch directory, in page order, as argv lists (never a shell):

- `epi …` runs this checkout's epi (`python -m epi`), `dask …` the installed Dask CLI;
- `VAR=value` words before the command are its environment;
- a command ending in ` &` starts in the background (a daemon, a worker) and is stopped at
  the end; when it names a `--listen HOST:PORT` or `--port PORT`, the next command waits
  until that port accepts connections;
- an interactive view (`epi meter watch`) runs for a few seconds: still running then is its
  success, exiting early is a failure unless with status 0.

Each command must exit 0. Each output line the page shows is checked by its words up to its
first digit (at least 8 characters of them): the structure of the output, not its numbers,
which differ from machine to machine.

Substitutions (`subs`) map the page's placeholders (a model path, a fixed port, the
repository's `hardware/` directory) to this test's.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INTERACTIVE = ("meter watch",)
INTERACTIVE_S = 4.0


@dataclass
class Command:
    line: str
    shown: list[str] = field(default_factory=list)


def commands(page: Path) -> list[Command]:
    out: list[Command] = []
    in_block = False
    pending = ""
    for raw in page.read_text().splitlines():
        if raw.startswith("```"):
            in_block = raw.strip() == "```console" if not in_block else False
            continue
        if not in_block:
            continue
        if pending:
            pending += " " + raw.strip().rstrip("\\").strip()
            if not raw.rstrip().endswith("\\"):
                out.append(Command(pending))
                pending = ""
            continue
        if raw.startswith("$ "):
            text = raw[2:].rstrip()
            if text.endswith("\\"):
                pending = text.rstrip("\\").strip()
            else:
                out.append(Command(text))
        elif out and raw.strip() and raw.strip() != "…":
            out[-1].shown.append(raw)
    return out


def _key(line: str) -> str | None:
    """The words of a shown line up to its first number or ellipsis.

    None when fewer than six characters are left: too little to check.
    A number's sign belongs to the number: a measured offset may come out either side of zero.
    """
    head = re.split(r"[-+−±]?\s?[0-9…]", line, maxsplit=1)[0].strip()
    return head if len(head) >= 6 else None


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"background command exited ({proc.returncode}) before "
                                 f"port {port} answered")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"nothing answered on port {port} within {timeout_s:.0f} s")


def run_page(page: Path, workdir: Path, subs: dict[str, str]) -> list[str]:
    """Run every command of `page` in `workdir`; the transcript (for a failure message)."""
    transcript: list[str] = []
    background: list[subprocess.Popen[bytes]] = []
    try:
        for cmd in commands(page):
            line = cmd.line
            for old, new in subs.items():
                line = line.replace(old, new)
            bg = line.endswith("&")
            words = shlex.split(line.rstrip("&").strip())
            env = dict(os.environ)
            while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
                k, v = words.pop(0).split("=", 1)
                env[k] = v
            argv = ([sys.executable, "-m", words[0], *words[1:]]
                    if words[0] in ("epi", "dask") else words)
            env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
            transcript.append(f"$ {line}")
            if bg:
                log = (workdir / f"bg-{len(background)}.log").open("wb")
                proc = subprocess.Popen(argv, cwd=workdir, env=env, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
                background.append(proc)
                m = re.search(r"--(?:listen \S+:|port )(\d+)", line)
                if m:
                    _wait_port(int(m.group(1)), proc)
                continue
            if any(words[1:3] == i.split() for i in INTERACTIVE) and words[0] == "epi":
                proc = subprocess.Popen(argv, cwd=workdir, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
                try:
                    proc.wait(INTERACTIVE_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    transcript.append("(interactive: still running after "
                                      f"{INTERACTIVE_S:g} s, stopped)")
                    continue
                out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
                assert proc.returncode == 0, "\n".join([*transcript, out])
                continue
            done = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True,
                                  timeout=900)
            text = done.stdout + done.stderr
            transcript.append(text)
            assert done.returncode == 0, "\n".join(transcript)
            for shown in cmd.shown:
                key = _key(shown)
                for old, new in subs.items():
                    key = key.replace(old, new) if key else key
                if key is not None:
                    assert key in text, f"the page shows {shown!r}; the command printed:\n{text}"
    finally:
        for proc in background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    return transcript
