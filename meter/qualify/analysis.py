"""Judging a board's qualification: per channel, each finding with its threshold (pure).

The session (meter/qualify/session.py) measures windows — every channel idle, then each
channel loaded in turn (at PF 1 and, where the load allows, at a low power factor) — and a
reference gives the energy each loaded window really took. From those, per channel:

* **energy error** of the counter against the reference, with its uncertainty (reference,
  one energy count, the chip's 0.1 % class, combined in quadrature);
* **noise floor** at zero load (the larger of |mean Pmean| and the counter's rate) and the
  **smallest load metered** (the start-up threshold, or the floor over the class if higher);
* **CT orientation** (reverse energy under load);
* **crosstalk**: energy a channel meters while only another one is loaded;
* **counter vs integral**: the energy counter against ∫Pmean dt over the same window, within
  what the register steps and the accuracy class allow;
* **phase**: the energy error at a low power factor against the one at PF 1;
* **dead channel**: no energy and no current under load.

Pass or fail against a stated accuracy class (percent). Every threshold is stated in the
result, beside the figure it judged.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from epi.formats.json_types import JSON

CHIP_CLASS_PCT = 0.1  # active energy over 5000:1 [DS p.1]
PMEAN_LSB_EXT_W = 1.0 / 256  # Pmean with the LSB extension [DS p.26]
CROSSTALK_LIMIT_FRAC = 0.002  # another channel's energy over the loaded one's (0.2 %)
REVERSE_LIMIT_FRAC = 0.01  # reverse energy share under load that means a reversed CT
DEAD_CURRENT_A = 0.001  # below one Irms LSB under load: no current seen
REFUSED_LIMIT_FRAC = 0.01  # readings the plausibility rules may refuse (fast loads: ~0)


@dataclass(frozen=True)
class Window:
    """One channel over one measured interval."""

    seconds: float
    counter_j: float  # forward energy from the counter
    reverse_j: float
    integral_j: float  # ∫ Pmean dt over the readings
    mean_power_w: float
    mean_current_a: float
    mean_voltage_v: float
    rows: int
    refused: int
    joules_per_count: float


@dataclass(frozen=True)
class Finding:
    name: str
    ok: bool
    value: float | None
    limit: float | None
    detail: str


@dataclass
class ChannelQualification:
    channel: str
    accuracy_class_pct: float
    energy_error_pct: float | None = None
    energy_error_u_pct: float | None = None
    noise_floor_w: float | None = None
    smallest_load_w: float | None = None
    findings: list[Finding] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(f.ok for f in self.findings)

    def as_dict(self) -> dict[str, JSON]:
        d = asdict(self)
        d["passed"] = self.passed
        return d


def energy_error(win: Window, reference_j: float, reference_pct: float
                 ) -> tuple[float, float]:
    """(error %, its standard uncertainty %) of the counter against the reference."""
    err = (win.counter_j / reference_j - 1.0) * 100.0
    count_pct = win.joules_per_count / reference_j * 100.0
    u = math.sqrt(reference_pct ** 2 + count_pct ** 2 + CHIP_CLASS_PCT ** 2)
    return err, u


def counter_integral_allowance_frac(win: Window, class_pct: float) -> float:
    """What the counter and ∫Pmean may disagree by: the class (both come from the same
    calibration, but Pmean's own offset and the chip's measurement path differ), half a
    Pmean step per reading interval and two energy counts."""
    energy = max(abs(win.counter_j), abs(win.integral_j), 1e-12)
    steps_j = PMEAN_LSB_EXT_W / 2 * win.seconds + 2 * win.joules_per_count
    return class_pct / 100.0 + steps_j / energy


def judge_channel(name: str, idle: Window, loaded: Window, reference_j: float,
                  reference_pct: float, class_pct: float, start_w: float,
                  min_load_w: float, crosstalk: dict[str, Crosstalk],
                  low_pf: tuple[Window, float] | None = None) -> ChannelQualification:
    """All findings of one channel. `crosstalk` maps each other channel to what this one
    saw of it while only that one was loaded (idle floor removed); `low_pf` is a loaded
    window at a low power factor with its reference energy."""
    q = ChannelQualification(name, class_pct)
    f = q.findings
    dead = (loaded.counter_j + loaded.reverse_j <= 2 * loaded.joules_per_count
            and loaded.mean_current_a < DEAD_CURRENT_A)
    load_w = reference_j / loaded.seconds
    f.append(Finding("alive", not dead, loaded.mean_current_a, DEAD_CURRENT_A,
                     f"no energy and no current under a {load_w:.3g} W load: CT unplugged, "
                     "burden open or wrong channel" if dead
                     else f"current {loaded.mean_current_a:.4g} A under load"))
    total = loaded.counter_j + loaded.reverse_j
    rev = loaded.reverse_j / total if total > 0 else 0.0
    reversed_ct = rev > REVERSE_LIMIT_FRAC
    f.append(Finding("ct_orientation", not reversed_ct, rev, REVERSE_LIMIT_FRAC,
                     f"{rev:.0%} of the energy flowed in reverse: CT clamped the wrong way "
                     "round; turn it (arrow towards the load)" if reversed_ct else "forward"))
    if dead or reversed_ct:
        return q  # the other figures of a dead or reversed channel mean nothing
    err, u = energy_error(loaded, reference_j, reference_pct)
    q.energy_error_pct, q.energy_error_u_pct = err, u
    f.append(Finding("energy_error", abs(err) <= class_pct + 2 * u, err, class_pct + 2 * u,
                     f"counter {err:+.3f} % against the reference (± {u:.3f} %, k = 1); limit: "
                     "the class plus twice the uncertainty"))
    floor = max(abs(idle.mean_power_w), idle.counter_j / idle.seconds)
    q.noise_floor_w = floor
    q.smallest_load_w = max(start_w, floor * 100.0 / class_pct)
    limit = class_pct / 100.0 * min_load_w
    f.append(Finding("noise_floor", floor <= limit, floor, limit,
                     f"{floor:.4f} W at zero load (|mean Pmean| or the counter's rate); limit: "
                     f"the class of the smallest load {min_load_w:.3g} W (a power or current "
                     "offset)"))
    sweeps = [w for w in (idle, loaded) if w.rows + w.refused]
    refused = sum(w.refused for w in sweeps) / max(sum(w.rows + w.refused for w in sweeps), 1)
    f.append(Finding("plausible_rows", refused <= REFUSED_LIMIT_FRAC, refused,
                     REFUSED_LIMIT_FRAC,
                     f"{refused:.1%} of the readings refused (P != U·I·PF): a power or current "
                     "offset, or Ugain/Igain off" if refused > REFUSED_LIMIT_FRAC
                     else f"{refused:.2%} of the readings refused"))
    if loaded.rows > 1:
        gap = (loaded.counter_j - loaded.integral_j) / max(loaded.integral_j, 1e-12)
        allow = counter_integral_allowance_frac(loaded, class_pct)
        f.append(Finding("counter_vs_integral", abs(gap) <= allow, gap, allow,
                         f"counter {gap:+.3%} from the integral of Pmean (allowed ± {allow:.3%})"
                         ": beyond it, the PL constant, Lgain or a power offset is wrong"))
    unknown = [(o, c) for o, c in crosstalk.items() if c.fraction is None]
    known = [(o, c.fraction, c.basis) for o, c in crosstalk.items() if c.fraction is not None]
    worst = max(known, key=lambda kv: kv[1], default=None)
    if unknown:  # not judged is not passed
        other, c = unknown[0]
        f.append(Finding("crosstalk", False, None, CROSSTALK_LIMIT_FRAC,
                         f"from {other}: {c.basis}"))
    elif worst is not None:
        other, frac, basis = worst
        f.append(Finding("crosstalk", frac <= CROSSTALK_LIMIT_FRAC, frac, CROSSTALK_LIMIT_FRAC,
                         f"{frac:.3%} of {other}'s load seen here while only {other} was "
                         f"loaded (by {basis})"))
    if low_pf is not None:
        win, ref = low_pf
        err_low, u_low = energy_error(win, ref, reference_pct)
        diff = err_low - err
        lim = class_pct + 2 * math.hypot(u, u_low)
        f.append(Finding("phase", abs(diff) <= lim, diff, lim,
                         f"error at low PF {err_low:+.3f} % vs {err:+.3f} % at PF 1: a phase "
                         f"error (Lphi) worth {diff:+.3f} %"))
    return q


@dataclass(frozen=True)
class Crosstalk:
    """What a victim channel sees of an aggressor's load: `fraction` (None when it cannot be
    estimated) and `basis`, how it was estimated or why it could not be."""

    fraction: float | None
    basis: str


def crosstalk_fraction(victim_loaded_other: Window, victim_idle: Window,
                       aggressor_loaded: Window, aggressor_reference_j: float) -> Crosstalk:
    """What the victim sees while only the aggressor is loaded, over what the aggressor draws.

    By current where the victim has readings (Irms with its LSB extension resolves µA, well
    below the start-up threshold a small crosstalk never reaches), else by energy; the
    victim's idle level removed. The aggressor's side comes from its own readings only where
    they saw the load: readings refused wholesale (a power offset fails P = U·I·PF on every
    one) or a dead aggressor would divide by nothing. Then its load comes from the reference
    (the current at the voltage seen, PF 1: the qualification's loaded step)."""
    ref_w = aggressor_reference_j / aggressor_loaded.seconds if aggressor_loaded.seconds > 0 \
        else 0.0
    if victim_loaded_other.rows and victim_idle.rows:
        extra = max(victim_loaded_other.mean_current_a - victim_idle.mean_current_a, 0.0)
        if aggressor_loaded.rows and aggressor_loaded.mean_current_a >= DEAD_CURRENT_A:
            return Crosstalk(extra / aggressor_loaded.mean_current_a, "current")
        volts = aggressor_loaded.mean_voltage_v if aggressor_loaded.rows else \
            victim_loaded_other.mean_voltage_v
        if ref_w > 0 and volts > 0:
            return Crosstalk(extra / (ref_w / volts), "current, the aggressor's from the "
                             "reference (its own readings saw no current)")
        return Crosstalk(None, "n/a: the loaded channel's readings saw no current and the "
                         "reference no energy (nothing to compare with)")
    extra_j = max(victim_loaded_other.counter_j + victim_loaded_other.reverse_j
                  - victim_idle.counter_j / victim_idle.seconds * victim_loaded_other.seconds,
                  0.0)
    if aggressor_loaded.counter_j > 2 * aggressor_loaded.joules_per_count:
        return Crosstalk(extra_j / aggressor_loaded.counter_j, "energy")
    if aggressor_reference_j > 0:
        return Crosstalk(extra_j / aggressor_reference_j, "energy, the aggressor's from the "
                         "reference (its counter saw none)")
    return Crosstalk(None, "n/a: no readings here, and the loaded channel's counter and the "
                     "reference saw no energy (nothing to compare with)")
