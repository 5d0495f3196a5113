"""What a channel's measurement chain resolves at a given load: `epi meter plan`.

From the board file (CT ratio, burden, turns of the feed through the clamp, PGA gain, meter
constant, front end, sample period) and the datasheet figures collected in docs/atm90e26.md,
each channel gets, at the lowest and highest load asked for:

* the step of every measurement register (Irms, Urms, Pmean, Smean, PowerF), without and with
  the LSB extension, in the conductor's own units (the turns are in V_L, hence in the PL
  constant and the gains, so every figure is divided back by them);
* energy counts per sweep and per typical prefill/decode window, and the CF pulse rate;
* the analog signal at the current input, the chip's 5000:1 accuracy range, ADC headroom at
  the CT's largest current, the start-up threshold;
* the instrument part of a J/token figure's uncertainty (chip class, CT class or calibration
  reference, PL-constant rounding, one energy count);
* what to change (turns, burden, PGA gain, meter constant) when the chain cannot resolve it.

Standard library only: `epi meter` must not import host dependencies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from epi.formats.json_types import JSON
from meter.board.config import BoardConfig, ChannelConfig
from meter.chip import registers as regs
from meter.chip.calibration import (
    JOULES_PER_KWH,
    PL_NUMERATOR,
    Calibration,
    l_pga_gain,
    meter_constant_from_pl,
    pl_from_words,
    start_threshold,
    threshold_power_w,
)

# ---- datasheet figures (docs/atm90e26.md §3, DS features page and Tables 2/3) ----------------
CHIP_ENERGY_ACCURACY_PCT = 0.1  # active energy, over a dynamic range of 5000:1 [DS p.1]
CHIP_DYNAMIC_RANGE = 5000.0  # [DS p.1, Tables 2/3]
LSB_EXTENSION_STEPS = 256  # LSB (08H) bits 15:8 extend RMS/power registers [DS p.26; AN §4.4]
PULSES_PER_COUNT = regs.PULSES_PER_COUNT  # one energy LSB = 0.1 CF pulse [DS §3.3]
ENERGY_WRAP_COUNTS = regs.ENERGY_WRAP
PGA_GAINS = (1, 4, 8, 16, 24)  # MMode Lgain field [DS register page of 2BH]
# *Modelling choice*: the current channel's full-scale input (after the PGA) is not in the
# datasheet text this project holds; 500 mV peak is assumed (docs/atm90e26.md §9). Headroom
# and the top of the 5000:1 range follow from it and are printed as assumptions.
ADC_FULL_SCALE_MV_PEAK_ASSUMED = 500.0
FIELD_DRIVER_METER_CONSTANT = 3200.0  # ESPHome's example, whatnick's library (docs §9)
# Defaults of the resolution checks (the analysis's --max-resolution-frac is 0.5 %).
DEFAULT_MAX_COUNT_FRAC = 0.005
DEFAULT_PREFILL_S = 0.5
DEFAULT_DECODE_S = 10.0
DEFAULT_REFERENCE_PCT = 1.0  # a plug-in energy meter's stated accuracy (typical class 1)
DEFAULT_CT_CLASS_PCT = 1.0  # assumed when the board file gives no ct.accuracy_class_pct
MIN_PL_FOR_BIAS_PCT = 0.01  # PL-constant rounding bias the remedies keep below (in %)


class PlanError(ValueError):
    """A board or option the plan cannot evaluate (one line, names the key)."""


@dataclass(frozen=True)
class Chain:
    """One channel's measurement chain, as the chip is configured for it."""

    name: str
    un_v: float
    ib_a: float
    v_l_mv: float  # mV at the current input at Ib, turns included
    v_u_mv: float
    turns: int
    ct_ratio: float | None
    burden_ohm: float | None
    max_current_a: float | None  # the CT's largest primary current (ct.max_current_a)
    ct_class_pct: float
    ct_class_assumed: bool
    pga_gain: int
    meter_constant_imp_per_kwh: float
    pl_constant: int
    start_word: int
    sample_period_s: float


@dataclass(frozen=True)
class RegisterStep:
    register: str
    unit: str
    step: float  # one register LSB, conductor units
    step_extended: float  # with the LSB extension
    value: float  # the register's value at this load
    step_pct: float  # step / value in %


@dataclass(frozen=True)
class LoadFigures:
    """A chain's figures at one load."""

    load_w: float
    volts: float
    current_a: float
    input_mv_rms: float  # at the current input (before the PGA)
    steps: tuple[RegisterStep, ...]
    joules_per_count: float
    counts_per_sweep: float
    counts_per_prefill: float
    counts_per_decode: float
    cf_pulse_hz: float
    wrap_s: float  # the 16-bit energy register wraps after this long at this load
    above_start: bool
    in_accuracy_range: bool
    uncertainty_pct: dict[str, float]
    total_uncertainty_pct: float


@dataclass(frozen=True)
class ChannelPlan:
    chain: Chain
    loads: tuple[LoadFigures, ...]
    start_w: float
    pl_bias_pct: float
    accuracy_range_a: tuple[float, float]  # (lowest, highest) current of the 5000:1 range
    headroom: float | None  # ADC full scale / peak input at max_current_a
    problems: tuple[str, ...]
    remedies: tuple[str, ...] = field(default=())

    @property
    def resolves(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class PlanOptions:
    load_w: tuple[float, float]
    volts: float | None = None  # default: the board's Un
    power_factor: float = 1.0
    prefill_s: float = DEFAULT_PREFILL_S
    decode_s: float = DEFAULT_DECODE_S
    reference_pct: float = DEFAULT_REFERENCE_PCT
    calibrated: bool = True  # the gain was calibrated against the reference (CT class out)
    max_count_frac: float = DEFAULT_MAX_COUNT_FRAC


# ---- the chain --------------------------------------------------------------------------------
def _ct_number(ct: dict[str, JSON], key: str, where: str) -> float | None:
    value = ct.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
            value) or value <= 0:
        raise PlanError(f"{where}ct.{key}: must be a finite number > 0, got {value!r}")
    return float(value)


def chain_of(channel: ChannelConfig, sample_period_s: float) -> Chain:
    """The chain as configured: the channel's calibration if loaded, else design values."""
    where = f"channel {channel.name}: "
    cal: Calibration = channel.calibration or channel.design_calibration()
    fe = dict(cal.frontend or channel.frontend)
    mmode = cal.registers.get("MMode", regs.BY_NAME["MMode"].reset)
    pl = pl_from_words(cal.registers["PLconstH"], cal.registers["PLconstL"])
    turns = _ct_number(channel.ct, "turns", where) or 1.0
    ct_class = _ct_number(channel.ct, "accuracy_class_pct", where)
    return Chain(
        name=channel.name,
        un_v=fe["un_v"],
        ib_a=fe["ib_a"],
        v_l_mv=fe["v_l_mv"],
        v_u_mv=fe["v_u_mv"],
        turns=int(turns),
        ct_ratio=_ct_number(channel.ct, "ratio", where),
        burden_ohm=_ct_number(channel.ct, "burden_ohm", where),
        max_current_a=_ct_number(channel.ct, "max_current_a", where),
        ct_class_pct=ct_class if ct_class is not None else DEFAULT_CT_CLASS_PCT,
        ct_class_assumed=ct_class is None,
        pga_gain=l_pga_gain(mmode),
        meter_constant_imp_per_kwh=cal.meter_constant_imp_per_kwh,
        pl_constant=pl,
        start_word=cal.registers.get("PStartTh", regs.BY_NAME["PStartTh"].reset),
        sample_period_s=sample_period_s,
    )


def ideal_pl(chain: Chain, meter_constant: float | None = None, v_l_mv: float | None = None,
             pga_gain: int | None = None) -> float:
    """The unrounded PL constant (AN §3.2.2) for the chain, or with one thing changed."""
    mc = meter_constant if meter_constant is not None else chain.meter_constant_imp_per_kwh
    vl = v_l_mv if v_l_mv is not None else chain.v_l_mv
    g = pga_gain if pga_gain is not None else chain.pga_gain
    return PL_NUMERATOR * g * vl * chain.v_u_mv / (mc * chain.un_v * chain.ib_a)


def pl_bias_pct(chain: Chain) -> float:
    """Energy epi reports / energy metered − 1, in %: the chip meters at the meter constant
    the rounded PL gives, epi converts counts with the nominal one."""
    actual = meter_constant_from_pl(chain.pl_constant, chain.un_v, chain.ib_a, chain.pga_gain,
                                    chain.v_l_mv, chain.v_u_mv)
    return (actual / chain.meter_constant_imp_per_kwh - 1.0) * 100.0


def joules_per_count(meter_constant: float) -> float:
    return PULSES_PER_COUNT * JOULES_PER_KWH / meter_constant


def start_w(chain: Chain) -> float:
    """The active start-up threshold in watts (PStartTh; K·Un·Ib, AN §3.2.3)."""
    return float(threshold_power_w(chain.start_word, chain.un_v, chain.ib_a, chain.pga_gain,
                                   chain.v_l_mv, chain.v_u_mv))


def full_scale_current_a(chain: Chain) -> float:
    """The conductor current (rms, sine) whose peak reaches the assumed ADC full scale."""
    peak_per_a = chain.v_l_mv / chain.ib_a * math.sqrt(2.0) * chain.pga_gain
    return ADC_FULL_SCALE_MV_PEAK_ASSUMED / peak_per_a


def accuracy_range_a(chain: Chain) -> tuple[float, float]:
    """The 5000:1 range of 0.1 % energy accuracy, topped by the ADC or the CT, lower."""
    top = full_scale_current_a(chain)
    if chain.max_current_a is not None:
        top = min(top, chain.max_current_a)
    return top / CHIP_DYNAMIC_RANGE, top


def headroom(chain: Chain) -> float | None:
    """ADC full scale over the peak input at the CT's largest current (None: not given)."""
    if chain.max_current_a is None:
        return None
    return full_scale_current_a(chain) / chain.max_current_a


# ---- figures at one load ----------------------------------------------------------------------
def _steps(power_w: float, volts: float, current_a: float, pf: float) -> tuple[RegisterStep, ...]:
    apparent = volts * current_a
    out = []
    for name, value in (("Irms", current_a), ("Urms", volts), ("Pmean", power_w),
                        ("Smean", apparent), ("PowerF", pf)):
        r = regs.BY_NAME[name]
        ext = r.scale / LSB_EXTENSION_STEPS if r.extended else r.scale
        out.append(RegisterStep(name, r.unit, r.scale, ext, value,
                                r.scale / value * 100.0 if value else math.inf))
    return tuple(out)


def figures(chain: Chain, load_w: float, opts: PlanOptions) -> LoadFigures:
    volts = opts.volts if opts.volts is not None else chain.un_v
    current = load_w / (volts * opts.power_factor)
    jpc = joules_per_count(chain.meter_constant_imp_per_kwh)
    lo, hi = accuracy_range_a(chain)
    in_range = lo <= current <= hi
    per_prefill = load_w * opts.prefill_s / jpc
    terms = {
        # outside the 5000:1 range the datasheet specifies no energy accuracy: infinite
        "chip energy class": CHIP_ENERGY_ACCURACY_PCT if in_range else math.inf,
        ("calibration reference" if opts.calibrated else "CT class"):
            opts.reference_pct if opts.calibrated else chain.ct_class_pct,
        "PL-constant rounding": abs(pl_bias_pct(chain)),
        "one count per prefill window": 100.0 / per_prefill if per_prefill > 0 else math.inf,
    }
    total = math.sqrt(sum(v * v for v in terms.values()))
    return LoadFigures(
        load_w=load_w,
        volts=volts,
        current_a=current,
        input_mv_rms=chain.v_l_mv * current / chain.ib_a,
        steps=_steps(load_w, volts, current, opts.power_factor),
        joules_per_count=jpc,
        counts_per_sweep=load_w * chain.sample_period_s / jpc,
        counts_per_prefill=per_prefill,
        counts_per_decode=load_w * opts.decode_s / jpc,
        cf_pulse_hz=load_w / JOULES_PER_KWH * chain.meter_constant_imp_per_kwh,
        wrap_s=ENERGY_WRAP_COUNTS * jpc / load_w,
        above_start=load_w > start_w(chain),
        in_accuracy_range=in_range,
        uncertainty_pct=terms,
        total_uncertainty_pct=total,
    )


# ---- verdict and remedies ---------------------------------------------------------------------
def _problems(chain: Chain, low: LoadFigures, high: LoadFigures, opts: PlanOptions
              ) -> list[str]:
    out = []
    if not low.above_start:
        out.append(f"{low.load_w:g} W is below the start-up threshold {start_w(chain):.3g} W: "
                   "the chip meters nothing")
    lo_a, hi_a = accuracy_range_a(chain)
    if low.current_a < lo_a:
        out.append(f"{low.current_a * 1000:.3g} mA is below the 0.1 % range "
                   f"({lo_a * 1000:.3g} mA = 1/5000 of {hi_a:.3g} A)")
    if high.current_a > hi_a:
        out.append(f"{high.current_a:.3g} A is above the top of the range ({hi_a:.3g} A)")
    if low.counts_per_prefill * opts.max_count_frac < 1.0:
        out.append(f"{low.counts_per_prefill:.3g} energy counts per {opts.prefill_s:g} s prefill "
                   f"window: one count is more than {opts.max_count_frac * 100:g} %")
    if high.wrap_s < 4 * chain.sample_period_s:
        out.append(f"the energy register wraps after {high.wrap_s:.3g} s at {high.load_w:g} W, "
                   f"under 4 sweeps of {chain.sample_period_s:g} s")
    if abs(pl_bias_pct(chain)) > 0.05:
        out.append(f"PL constant {chain.pl_constant} rounds the meter constant by "
                   f"{pl_bias_pct(chain):+.3f} %")
    return out


def _remedies(chain: Chain, low: LoadFigures, high: LoadFigures, opts: PlanOptions
              ) -> list[str]:
    """What to change, each with the figure it reaches. Turns and burden raise the signal
    (and lower the headroom by the same factor); PGA gain raises it after the CT; the meter
    constant raises the counts."""
    lo_a, hi_a = accuracy_range_a(chain)
    out = []
    need = lo_a / low.current_a if low.current_a < lo_a else 1.0
    if not low.above_start:
        # the threshold is a fraction K of Un·Ib (AN §3.2.3): lower K to a third below the load,
        # but not under the bottom of the 0.1 % range, which only more signal lowers
        k = low.load_w / 1.5 / (chain.un_v * chain.ib_a)
        floor_k = lo_a / chain.ib_a
        if k >= floor_k:
            word = start_threshold(chain.pga_gain, chain.v_l_mv, chain.v_u_mv, k)
            out.append(f"lower the start-up threshold to {k * chain.un_v * chain.ib_a:.3g} W: "
                       f"registers.PStartTh = 0x{word:04X} in the calibration file (K = "
                       f"{k:.3g} of Ib)")
        else:
            need = max(need, floor_k / k)
    if need > 1.0:
        turns = math.ceil(chain.turns * need)
        out.append(f"loop the feed {turns} times through the clamp (ct.turns = {turns}; epi "
                   f"divides them back through the PL constant and gains), which leaves "
                   f"{hi_a * chain.turns / turns:.3g} A at the top of the range")
        if chain.burden_ohm is not None:
            out.append(f"or a burden of {chain.burden_ohm * need:.3g} ohm (within the CT's rated "
                       "burden: check its datasheet)")
        higher = [g for g in PGA_GAINS if g >= chain.pga_gain * need]
        if higher:
            out.append(f"or PGA gain {higher[0]} (MMode Lgain; the ADC sees {higher[0]}x the "
                       "signal, the CT and burden the same)")
    overload = high.current_a > hi_a
    if overload:
        out += _overload_remedies(chain, low, high)
    if low.counts_per_prefill * opts.max_count_frac < 1.0:
        mc = chain.meter_constant_imp_per_kwh / (low.counts_per_prefill * opts.max_count_frac)
        out.append(f"raise meter_constant_imp_per_kwh to {mc:.3g} (PL constant "
                   f"{ideal_pl(chain, meter_constant=mc):.4g})")
    if high.wrap_s < 4 * chain.sample_period_s:
        # the counter must not wrap twice between two reads: at most one wrap per 4 sweeps
        mc = chain.meter_constant_imp_per_kwh * high.wrap_s / (4 * chain.sample_period_s)
        counts = low.counts_per_prefill * mc / chain.meter_constant_imp_per_kwh
        short = (f"; it leaves {counts:.3g} counts per {opts.prefill_s:g} s prefill at "
                 f"{low.load_w:g} W" if counts * opts.max_count_frac < 1.0 else "")
        out.append(f"lower meter_constant_imp_per_kwh to <= {mc:.3g} (the energy register then "
                   f"wraps after 4 sweeps at {high.load_w:g} W), or sweep faster{short}")
    if abs(pl_bias_pct(chain)) > 0.05 or ideal_pl(chain) < 0.5 / (MIN_PL_FOR_BIAS_PCT / 100):
        mc = PL_NUMERATOR * chain.pga_gain * chain.v_l_mv * chain.v_u_mv / (
            chain.un_v * chain.ib_a * 0.5 / (MIN_PL_FOR_BIAS_PCT / 100))
        # more signal would push an overloaded chain further past the top of its range
        more = "" if overload else ", or more signal (turns, burden, PGA gain)"
        out.append(f"for a PL-constant rounding below {MIN_PL_FOR_BIAS_PCT:g} %: meter constant "
                   f"<= {mc:.3g} imp/kWh{more}")
    return out


def _overload_remedies(chain: Chain, low: LoadFigures, high: LoadFigures) -> list[str]:
    """The highest load draws more than the top of the range: less signal where the ADC is
    the limit (fewer turns, a smaller burden, a lower PGA gain, a CT of a higher ratio), a CT
    rated for more where the CT is. Less signal raises the bottom of the range by as much."""
    out = []
    if chain.max_current_a is not None and high.current_a > chain.max_current_a:
        out.append(f"a CT rated for at least {high.current_a:.3g} A (ct.max_current_a is "
                   f"{chain.max_current_a:g} A; less signal does not help a CT past its rating)")
    adc_top = full_scale_current_a(chain)
    if high.current_a <= adc_top:
        return out
    less = high.current_a / adc_top  # the factor the signal must drop by
    options = []
    turns = math.floor(chain.turns / less)
    if chain.turns > 1 and turns >= 1:
        options.append(f"loop the feed {turns} time(s) through the clamp (ct.turns = {turns})")
    if chain.burden_ohm is not None:
        options.append(f"a burden of {chain.burden_ohm / less:.3g} ohm")
    lower = [g for g in PGA_GAINS if g <= chain.pga_gain / less]
    if lower and chain.pga_gain > 1:
        options.append(f"PGA gain {lower[-1]} (MMode Lgain)")
    if chain.ct_ratio is not None:
        options.append(f"a CT of ratio {chain.ct_ratio * less:.3g}:1 or more")
    if options:
        lo_a = adc_top * less / CHIP_DYNAMIC_RANGE
        note = (f"; the bottom of the range rises to {lo_a * 1000:.3g} mA, above the "
                f"{low.current_a * 1000:.3g} mA of {low.load_w:g} W: the loads span more than "
                "the chip's 5000:1, meter them on two channels" if low.current_a < lo_a else "")
        out.append(f"less signal, {less:.3g}x: " + ", or ".join(options) + note)
    return out


def plan_channel(chain: Chain, opts: PlanOptions) -> ChannelPlan:
    lo_w, hi_w = opts.load_w
    low, high = figures(chain, lo_w, opts), figures(chain, hi_w, opts)
    problems = _problems(chain, low, high, opts)
    return ChannelPlan(
        chain=chain,
        loads=(low, high),
        start_w=start_w(chain),
        pl_bias_pct=pl_bias_pct(chain),
        accuracy_range_a=accuracy_range_a(chain),
        headroom=headroom(chain),
        problems=tuple(problems),
        remedies=tuple(_remedies(chain, low, high, opts)),
    )


def plan_board(board: BoardConfig, opts: PlanOptions) -> list[ChannelPlan]:
    """Every enabled channel's plan. PlanError on options the figures cannot use."""
    lo, hi = opts.load_w
    if not (0 < lo <= hi) or not math.isfinite(hi):
        raise PlanError(f"--load-w: need 0 < MIN <= MAX, got {lo:g}..{hi:g}")
    if opts.volts is not None and not (0 < opts.volts <= 1000):
        raise PlanError(f"--volts: need 0 < V <= 1000, got {opts.volts:g}")
    if not 0 < opts.power_factor <= 1:
        raise PlanError(f"--pf: need 0 < PF <= 1, got {opts.power_factor:g}")
    if board.bridge is not None:
        raise PlanError(f"{board.path}: bus = \"bridge\": the chain is configured on the MCU; "
                        "plan the SPI board file it was deployed from")
    return [plan_channel(chain_of(ch, board.sample_period_s), opts)
            for ch in board.channels if ch.enabled]


# ---- text -------------------------------------------------------------------------------------
def meter_constant_tradeoff(chain: Chain, load_w: float) -> list[str]:
    """The meter-constant decision at this chain and load: epi's vs the field drivers'."""
    lines = []
    for label, mc in (("epi", chain.meter_constant_imp_per_kwh),
                      ("field drivers", FIELD_DRIVER_METER_CONSTANT)):
        jpc = joules_per_count(mc)
        pl = ideal_pl(chain, meter_constant=mc)
        rounded = max(1, round(pl))
        lines.append(f"  {label:13s} {mc:>12.4g} imp/kWh: {jpc:.4g} J/count, "
                     f"{load_w / jpc:.4g} counts/s at {load_w:g} W, PL {rounded} "
                     f"(rounding {(pl / rounded - 1) * 100:+.4f} %), CF "
                     f"{load_w / JOULES_PER_KWH * mc:.4g} Hz")
    return lines


def render(plans: list[ChannelPlan], opts: PlanOptions) -> str:
    out: list[str] = []
    for p in plans:
        c = p.chain
        ct = (f"CT {c.ct_ratio:g}:1 into {c.burden_ohm:g} ohm, " if c.ct_ratio and c.burden_ohm
              else "")
        out.append(f"channel {c.name}: {ct}{c.turns} turn(s), PGA x{c.pga_gain}, "
                   f"V_L {c.v_l_mv:g} mV at Ib {c.ib_a:g} A, meter constant "
                   f"{c.meter_constant_imp_per_kwh:.4g} imp/kWh, PL {c.pl_constant} "
                   f"({p.pl_bias_pct:+.4f} %), sweep {c.sample_period_s:g} s")
        lo_a, hi_a = p.accuracy_range_a
        hr = (f"{p.headroom:.3g}x at {c.max_current_a:g} A" if p.headroom is not None
              else "ct.max_current_a not given")
        out.append(f"  start-up threshold {p.start_w:.3g} W; 0.1 % range {lo_a * 1000:.3g} mA.."
                   f"{hi_a:.3g} A; ADC headroom {hr} (full scale "
                   f"{ADC_FULL_SCALE_MV_PEAK_ASSUMED:g} mV peak assumed)")
        for f in p.loads:
            out.append(f"  at {f.load_w:g} W, {f.volts:g} V, power factor "
                       f"{opts.power_factor:g} (--pf): {f.current_a * 1000:.4g} mA, "
                       f"{f.input_mv_rms:.4g} mV at the input")
            steps = ", ".join(f"{s.register} {s.step:g}{' ' + s.unit if s.unit else ''} "
                              f"({s.step_pct:.3g} %; {s.step_extended:.3g} with LSB)"
                              for s in f.steps)
            out.append(f"    register steps: {steps}")
            out.append(f"    energy: {f.joules_per_count * 1000:.4g} mJ/count, "
                       f"{f.counts_per_sweep:.4g} counts/sweep, {f.counts_per_prefill:.4g} per "
                       f"{opts.prefill_s:g} s prefill, {f.counts_per_decode:.4g} per "
                       f"{opts.decode_s:g} s decode; CF {f.cf_pulse_hz:.4g} Hz; register wraps "
                       f"after {f.wrap_s:.4g} s")
            terms = ", ".join(f"{k} {v:.3g} %" for k, v in f.uncertainty_pct.items())
            out.append(f"    instrument uncertainty of J/token: {f.total_uncertainty_pct:.3g} % "
                       f"({terms}; combined in quadrature)")
        if c.ct_class_assumed and not opts.calibrated:
            out.append(f"  CT class assumed {c.ct_class_pct:g} % (no ct.accuracy_class_pct)")
        out.append("  meter constant (docs/atm90e26.md §9):")
        out.extend(meter_constant_tradeoff(c, opts.load_w[0]))
        if p.resolves:
            out.append(f"  resolves {opts.load_w[0]:g}..{opts.load_w[1]:g} W")
        else:
            out.append(f"  does NOT resolve {opts.load_w[0]:g}..{opts.load_w[1]:g} W:")
            out.extend(f"    - {x}" for x in p.problems)
            out.append("  what to change:")
            out.extend(f"    - {x}" for x in p.remedies)
        out.append("")
    return "\n".join(out).rstrip() + "\n"


PLAN_FORMAT, PLAN_VERSION = "epi-meter-plan", 1


def _json_safe(value: object) -> JSON:
    """A plan's fields as JSON: tuples as lists, non-finite numbers as null (never NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if value is None or isinstance(value, (str, int)):
        return value
    raise TypeError(f"a plan field is not JSON: {value!r}")  # json.dumps would refuse it too


def plan_document(plans: list[ChannelPlan], opts: PlanOptions) -> dict[str, JSON]:
    """`epi meter plan --json`: the options and, per channel, its chain, its figures at each
    load, the problems and the remedies (the same fields the text prints)."""
    from dataclasses import asdict

    channels: list[JSON] = []
    for p in plans:
        fields = _json_safe(asdict(p))
        assert isinstance(fields, dict)  # asdict of a dataclass
        channels.append({**fields, "resolves": p.resolves})
    return {"format": PLAN_FORMAT, "format_version": PLAN_VERSION,
            "options": _json_safe(asdict(opts)), "channels": channels}
