"""What this machine has for epi (llama.cpp, models, data, meter hardware, power counters), each
with the fix for what is missing; `epi doctor` prints it."""

from __future__ import annotations

import glob
import importlib.util
import platform
import sys
from dataclasses import dataclass
from typing import Literal, get_args

from epi.core.errors import UserError
from epi.formats.fields import read_json_object
from epi.formats.manifests import read_model_manifest
from epi.formats.trace import EventKind


@dataclass
class Check:
    """One line of the report."""

    area: str
    item: str
    ok: bool | None  # None: informational (neither good nor bad)
    detail: str
    fix: str = ""


def _llama_checks() -> list[Check]:
    from host.llama import install as llama_install

    checks: list[Check] = []
    try:
        pkg = llama_install.package_dir()
    except Exception as exc:  # UserError when the package is absent
        return [Check("llama.cpp", "llama-cpp-python", False, str(exc), "make setup")]
    try:
        info = llama_install.llama_info()
    except Exception as exc:  # a library that does not load
        return [
            Check(
                "llama.cpp",
                "llama-cpp-python",
                False,
                f"does not load: {exc}",
                "make setup (rebuilds llama.cpp)",
            )
        ]
    flags = info["build_flags"]
    checks.append(
        Check("llama.cpp", "llama-cpp-python", True, f"{info['llama_cpp_python']} at {pkg}")
    )
    # a native x86 build turns on AMX, which crashed on quantized models; elsewhere native is fine
    flags_ok = "-DGGML_NATIVE=OFF" in flags or platform.machine() in ("aarch64", "arm64")
    checks.append(
        Check(
            "llama.cpp",
            "build flags",
            flags_ok if flags else False,
            " ".join(f for f in flags if "GGML" in f)
            or "unknown (not built by scripts/build_llama.sh)",
            ""
            if flags_ok
            else "make setup: a GGML_NATIVE=ON build crashes on quantized models on AMX CPUs",
        )
    )
    checks.append(_cpu_feature_check())
    checks.append(
        Check(
            "llama.cpp",
            "RPC backend",
            bool(info["rpc"]),
            "supported" if info["rpc"] else "not built",
            "make setup (GGML_RPC=ON)",
        )
    )
    for tool in llama_install.TOOLS:
        path = pkg / "bin" / tool
        checks.append(
            Check(
                "llama.cpp",
                tool,
                path.is_file(),
                str(path) if path.is_file() else "missing",
                "make setup",
            )
        )
    return checks


def _cpu_feature_check() -> Check:
    """The CPU features the build uses next to those the CPU has; warns on any left out."""
    from host.run.cpu_features import cpu_features, unused

    try:
        f = cpu_features()
    except Exception as exc:  # a library that does not load was reported above
        return Check("llama.cpp", "CPU features", False, f"unknown: {exc}", "make setup")
    build = " ".join(f["build"]) or "none reported"
    if f["cpu"] is None:
        return Check("llama.cpp", "CPU features", None,
                     f"build uses {build}; CPU's unknown ({f['cpu_reason']})")
    detail = f"build uses {build}; CPU has {' '.join(f['cpu']) or 'none llama.cpp uses'}"
    for name, why in f["notes"].items():
        detail += f"; {name} {why}"
    missing = unused(f)
    if missing:
        return Check("llama.cpp", "CPU features", False,
                     detail + f"; the build leaves out {' '.join(missing)}",
                     "rebuild for this CPU: rm the llama.cpp cache entry and `make setup` "
                     "(scripts/build_llama.sh picks flags per architecture)")
    return Check("llama.cpp", "CPU features", True, detail)


def _model_checks() -> list[Check]:
    from host.quant.models import SOURCES, model_path

    checks = []
    for name in SOURCES:
        path = model_path(name)
        manifest = path.with_suffix(".manifest.json")
        if path.is_file() and manifest.is_file():
            try:
                m = read_model_manifest(manifest)
            except UserError as exc:
                checks.append(Check("models", name, False, f"corrupt manifest: {exc}",
                                    f"epi model prepare {name} --force"))
                continue
            detail = f"{path} ({m.n_params / 1e6:.1f} M params, {m.n_layers} layers)"
            checks.append(Check("models", name, True, detail))
        else:
            checks.append(Check("models", name, False, "not prepared", f"epi model prepare {name}"))
    return checks


def _data_checks() -> list[Check]:
    from epi.core.paths import epi_home

    manifests = sorted((epi_home() / "data").glob("**/manifest.json"))
    if not manifests:
        return [Check("eval data", "benchmarks", False, "not prepared", "epi data prepare")]
    checks = []
    for path in manifests:
        try:
            m = read_json_object(path, "data manifest")
        except UserError:
            checks.append(
                Check("eval data", str(path), False, "unreadable manifest", "epi data prepare")
            )
            continue
        names = m.get("datasets") or m.get("benchmarks") or {}
        listed = ", ".join(sorted(names)) if isinstance(names, dict) else str(names)
        checks.append(Check("eval data", path.parent.name, True, listed or str(path)))
    return checks


def _module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def _hardware_checks() -> list[Check]:
    checks = []
    spi = sorted(glob.glob("/dev/spidev*"))
    checks.append(
        Check(
            "meter",
            "SPI devices",
            bool(spi) or None,
            " ".join(spi) or "none",
            ""
            if spi
            else "on a Pi: enable SPI0 (hardware/pi5-setup.md); "
            "elsewhere `epi meter run --emulate` uses the ATM90E26 emulator",
        )
    )
    gpio = sorted(glob.glob("/dev/gpiochip*"))
    checks.append(Check("meter", "GPIO chips", bool(gpio) or None, " ".join(gpio) or "none"))
    ports: list[str] = []
    if _module("serial"):
        from serial.tools import list_ports

        ports = [p.device for p in list_ports.comports()]
    checks.append(
        Check(
            "meter",
            "serial ports",
            bool(ports) or None,
            " ".join(ports) or "none",
            "" if ports else "the epi-meter MCU bridge appears as a USB serial port",
        )
    )
    for mod, use in (
        ("spidev", "SPI bus"),
        ("gpiozero", "GPIO chip-selects"),
        ("serial", "UART / MCU bridge"),
    ):
        have = _module(mod)
        checks.append(
            Check(
                "meter",
                f"python: {mod}",
                have,
                use if have else "not installed",
                "" if have else "pip install -e '.[meter]'",
            )
        )
    checks.append(Check("meter", "emulator", True, "ATM90E26 emulator available (--emulate)"))
    return checks


def _power_counter_checks() -> list[Check]:
    """Which software power counters exist here and which are readable (meter/sources)."""
    from meter.sources.factory import probe_sources

    checks = []
    probes = probe_sources()
    for p in probes:
        detail, _, fix = p.detail.partition("; fix: ")
        checks.append(Check(
            "power", f"{p.source} (component power, not wall)",
            True if p.readable else (False if p.present else None),
            f"readable: {detail}" if p.readable else detail,
            fix if p.present and not p.readable else "",
        ))
    if not any(p.readable for p in probes):
        checks.append(Check("power", "software power counters", None, "none readable here",
                            "wall energy comes from the epi-meter board or its emulator"))
    return checks


def collect_checks() -> list[Check]:
    """Every check, in display order."""
    checks = [
        Check("system", "python", True, f"{platform.python_version()} ({sys.executable})"),
        Check(
            "system",
            "machine",
            None,
            f"{platform.machine()}, {platform.system()} {platform.release()}",
        ),
    ]
    checks += _llama_checks() + _model_checks() + _data_checks()
    checks += _hardware_checks() + _bridge_checks() + _chain_checks() + _power_counter_checks()
    return checks


BOARD_ENV = "EPI_BOARD"  # a board file: does each channel resolve its expected_load_w?
METER_URL_ENV = "EPI_METER_URL"  # a running daemon: its /status says if a CT is reversed


def _chain_checks() -> list[Check]:
    """Each channel's expected load against what its chain resolves (the board file
    in $EPI_BOARD), and the CT orientation a running daemon has seen (its /status at
    $EPI_METER_URL: a channel with `reverse_energy` events has its clamp reversed)."""
    import os

    from meter.board.channels import load_board
    from meter.load_check import load_findings

    checks: list[Check] = []
    board_path = os.environ.get(BOARD_ENV)
    if board_path:
        try:
            found = load_findings(load_board(board_path))
        except UserError as exc:
            found = []
            checks.append(Check("meter", "board file", False, str(exc), f"fix {board_path}"))
        checks += [Check(f.area, f.item, f.ok, f.detail, f.fix) for f in found]
        if not found and not checks:
            checks.append(Check("meter", "load resolution", None,
                                f"{board_path}: no channel records expected_load_w"))
    else:
        checks.append(Check("meter", "load resolution", None, f"not checked (${BOARD_ENV} unset)",
                            f"{BOARD_ENV}=BOARD.toml epi doctor, with expected_load_w = "
                            "[MIN, MAX] in each [[channel]] (docs/meter.md)"))
    url = os.environ.get(METER_URL_ENV)
    if not url:
        checks.append(Check("meter", "CT orientation", None,
                            f"not checked (${METER_URL_ENV} unset)",
                            f"{METER_URL_ENV}=http://HOST:8757 epi doctor, with `epi meter run` "
                            "running"))
        return checks
    return checks + _orientation_checks(url)


def _orientation_checks(url: str) -> list[Check]:
    """One line per channel of the daemon at `url`: reversed when it counted reverse energy."""
    import json
    import urllib.error
    import urllib.request

    from epi.core.net import split_daemon_url
    from meter.driver.direction import FIX

    try:
        host, port, base = split_daemon_url(url)
        with urllib.request.urlopen(f"http://{host}:{port}{base}/status", timeout=3) as resp:
            status = json.loads(resp.read().decode())
    except UserError as exc:
        return [Check("meter", "CT orientation", False, str(exc), f"fix ${METER_URL_ENV}")]
    except (OSError, ValueError, urllib.error.URLError) as exc:
        return [Check("meter", "CT orientation", None, f"{url}: no daemon status ({exc})",
                      "start `epi meter run`, or fix $" + METER_URL_ENV)]
    channels = status.get("channels") if isinstance(status, dict) else None
    if not isinstance(channels, list):
        return [Check("meter", "CT orientation", False, f"{url}/status: no channel list",
                      "is this an epi meter daemon?")]
    checks = []
    for ch in channels:
        if not isinstance(ch, dict):
            continue
        faults = ch.get("faults")
        n = faults.get(EventKind.REVERSE_ENERGY, 0) if isinstance(faults, dict) else 0
        item = f"CT orientation {ch.get('name', '?')}"
        if isinstance(n, int) and n > 0:
            checks.append(Check("meter", item, False,
                                f"{n} reverse_energy event(s): reverse active energy metered "
                                "(kept apart, not counted)", FIX))
        else:
            checks.append(Check("meter", item, True, "no reverse energy metered"))
    return checks


def _bridge_checks() -> list[Check]:
    """The board's MCU over its UART: the port and the firmware version it answers."""
    try:
        from meter.bridge.probe import doctor_rows
    except ImportError as exc:  # pyserial missing
        return [Check("meter", "bridge port", None, f"not checked ({exc})", "pip install pyserial")]
    return [Check("meter", item, ok, detail, fix) for item, ok, detail, fix in doctor_rows()]


#: what a machine is for: `epi doctor --role` checks that what the role needs is there
Role = Literal["host", "worker", "meter", "analysis", "all"]
ROLES: tuple[Role, ...] = get_args(Role)
ROLE_HELP = {
    "host": "runs inference, accuracy and campaigns (llama.cpp, models, evaluation data)",
    "worker": "serves layers to a host as a llama.cpp RPC worker (ggml-rpc-server)",
    "meter": "reads the epi-meter board (SPI or the MCU bridge, its Python modules)",
    "analysis": "analyses traces and token logs only (nothing here is required)",
    "all": "every role above",
}
#: llama.cpp items an RPC worker needs; the host needs every llama.cpp item but CPU features
_WORKER_ITEMS = frozenset({"llama-cpp-python", "build flags", "RPC backend", "ggml-rpc-server"})
#: meter items that are a property of the board or a running daemon, needed where found
_METER_NEEDED_PREFIXES = ("python: ", "CT orientation", "load resolution")


def needed_by(check: Check) -> frozenset[Role]:
    """The roles for which a failed `check` is a missing requirement, not advice.

    CPU features that a portable build leaves out cost speed, not correctness, so no role
    needs them; power counters are component power, never the wall figure, so none needs
    them either."""
    if check.area == "llama.cpp":
        if check.item == "CPU features":
            return frozenset()
        return frozenset({"host", "worker"} if check.item in _WORKER_ITEMS else {"host"})
    if check.area in ("models", "eval data"):
        return frozenset({"host"})
    if check.area == "meter" and check.item.startswith(_METER_NEEDED_PREFIXES):
        return frozenset({"meter"})
    return frozenset()


def missing_for(checks: list[Check], role: Role) -> list[Check]:
    """The failed checks that `role` needs (every failed one that any role needs for "all")."""
    return [c for c in checks if c.ok is False
            and (needed_by(c) if role == "all" else role in needed_by(c))]
