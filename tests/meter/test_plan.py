"""`epi meter plan`: the chain's figures against closed forms from the datasheet figures.

Every expected figure here is computed from the datasheet / application-note numbers
(docs/atm90e26.md): one energy LSB = 0.1 CF pulse, PL = 838860800·G·V_L·V_U/(MC·Un·Ib),
start threshold K·Un·Ib, register LSBs 1 mA / 1 W / 0.01 V, V_L = Ib/ratio·burden·turns —
not from meter/plan.py.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from epi.commands.meter_group import meter
from epi.core.errors import UserError
from meter.board.file import load_board
from meter.plan import PlanOptions, plan_board

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "hardware" / "epi-meter.toml"
MC = 1e8  # the reference board's meter constant, imp/kWh
SWEEP_S = 0.05  # its sampling.period_s
RATIO, BURDEN_OHM, UN_V, IB_A, VU_MV = 2000.0, 100.0, 230.0, 1.0, 250.0


def _pl_ideal(turns: int = 1, mc: float = MC, ib_a: float = IB_A, burden: float = BURDEN_OHM
              ) -> float:
    v_l_mv = ib_a / RATIO * burden * turns * 1000.0
    return 838860800 * 1 * v_l_mv * VU_MV / (mc * UN_V * ib_a)


def _board(tmp_path: Path, ct: str, frontend: str = "") -> Path:
    path = tmp_path / "board.toml"
    path.write_text(
        'format = "epi-board"\nformat_version = 1\nname = "t"\n[sampling]\nperiod_s = 0.05\n'
        f"[frontend]\nun_v = 230.0\nib_a = 1.0\nv_u_mv = 250.0\n{frontend}\n"
        f'[[channel]]\nname = "a"\nchip_select = "GPIO8"\nct = {{ {ct} }}\n'
        "meter_constant_imp_per_kwh = 100000000\n")
    return path


@pytest.mark.parametrize("volts", [230.0, 120.0])
@pytest.mark.parametrize("load_w", [2.7, 9.5])
def test_reference_board_against_closed_form(volts: float, load_w: float) -> None:
    plans = plan_board(load_board(REFERENCE), PlanOptions(load_w=(load_w, load_w), volts=volts))
    assert len(plans) == 4
    p = plans[0]
    f = p.loads[0]
    current = load_w / volts
    j_per_count = 0.1 * 3.6e6 / MC  # 3.6 mJ
    assert f.current_a == pytest.approx(current, rel=1e-12)
    assert f.input_mv_rms == pytest.approx(current / RATIO * BURDEN_OHM * 1000, rel=1e-9)
    assert f.joules_per_count == pytest.approx(3.6e-3, rel=1e-12) == j_per_count
    assert f.counts_per_sweep == pytest.approx(load_w * SWEEP_S / j_per_count, rel=1e-9)
    assert f.counts_per_prefill == pytest.approx(load_w * 0.5 / j_per_count, rel=1e-9)
    assert f.counts_per_decode == pytest.approx(load_w * 10.0 / j_per_count, rel=1e-9)
    assert f.cf_pulse_hz == pytest.approx(load_w / 3.6e6 * MC, rel=1e-9)
    assert f.wrap_s == pytest.approx(65536 * j_per_count / load_w, rel=1e-9)
    steps = {s.register: s for s in f.steps}
    assert steps["Irms"].step_pct == pytest.approx(0.001 / current * 100, rel=1e-9)
    assert steps["Pmean"].step_pct == pytest.approx(1.0 / load_w * 100, rel=1e-9)
    assert steps["Pmean"].step_extended == 1 / 256
    assert steps["Urms"].step_pct == pytest.approx(0.01 / volts * 100, rel=1e-9)
    # PL constant 456 from 455.90..., and the bias that rounding gives (-0.021 %)
    assert p.chain.pl_constant == round(_pl_ideal()) == 456
    assert p.pl_bias_pct == pytest.approx((_pl_ideal() / 456 - 1) * 100, rel=1e-9)
    assert p.pl_bias_pct == pytest.approx(-0.0214, abs=5e-5)
    # start-up threshold K·Un·Ib with K = 0.2 % (the word rounds to 2330 of 2330.17)
    assert p.start_w == pytest.approx(0.002 * UN_V * IB_A, rel=1e-3)
    u = f.uncertainty_pct
    assert f.total_uncertainty_pct == pytest.approx(math.sqrt(
        0.1 ** 2 + 1.0 ** 2 + (_pl_ideal() / 456 - 1) ** 2 * 1e4
        + (100 / (load_w * 0.5 / j_per_count)) ** 2), rel=1e-9)
    assert set(u) == {"chip energy class", "calibration reference", "PL-constant rounding",
                      "one count per prefill window"}
    assert p.resolves, p.problems


def test_turns_are_divided_back(tmp_path: Path) -> None:
    path = _board(tmp_path, 'ratio = 2000, burden_ohm = 100.0, turns = 4')
    p = plan_board(load_board(path), PlanOptions(load_w=(2.7, 2.7)))[0]
    f = p.loads[0]
    assert p.chain.turns == 4
    assert p.chain.pl_constant == round(_pl_ideal(turns=4)) == 1824
    assert p.pl_bias_pct == pytest.approx((_pl_ideal(turns=4) / 1824 - 1) * 100, rel=1e-9)
    # the chip sees 4x the current; energy per count and the threshold stay the conductor's
    assert f.input_mv_rms == pytest.approx(2.7 / 230 / RATIO * BURDEN_OHM * 4 * 1000, rel=1e-9)
    assert f.counts_per_sweep == pytest.approx(2.7 * SWEEP_S / 3.6e-3, rel=1e-9)
    assert p.start_w == pytest.approx(0.46, rel=1e-3)


def test_half_turn_is_one_line(tmp_path: Path) -> None:
    path = _board(tmp_path, 'ratio = 2000, burden_ohm = 100.0, turns = 2.5')
    with pytest.raises(UserError, match=r"channel\[0\]\.ct\.turns: a whole number"):
        load_board(path)


def test_below_start_threshold_is_reported_with_its_fix(tmp_path: Path) -> None:
    # Ib = 10 A: the start-up threshold K·Un·Ib = 0.002·230·10 = 4.6 W is above 2.7 W
    path = _board(tmp_path, "ratio = 2000, burden_ohm = 100.0")
    text = path.read_text().replace("ib_a = 1.0", "ib_a = 10.0")
    path.write_text(text)
    p = plan_board(load_board(path), PlanOptions(load_w=(2.7, 9.5)))[0]
    assert p.start_w == pytest.approx(0.002 * 230 * 10, rel=1e-3)
    assert not p.resolves
    assert any("start-up threshold" in x for x in p.problems)
    k = 2.7 / 1.5 / (230 * 10)  # a third below the lowest load
    v_l_mv = 10 / RATIO * 100.0 * 1000
    word = round(93.2067556 * 1 * v_l_mv * VU_MV * k)  # AN §3.2.3
    assert any(f"PStartTh = 0x{word:04X}" in x for x in p.remedies), p.remedies


def test_weak_signal_gets_turns(tmp_path: Path) -> None:
    # 1 ohm burden: 0.5 mV at 1 A; the 0.1 % range starts at full scale / 5000
    path = _board(tmp_path, 'ratio = 2000, burden_ohm = 1.0')
    p = plan_board(load_board(path), PlanOptions(load_w=(2.7, 9.5)))[0]
    full_scale_a = 500.0 / (0.5 * math.sqrt(2))  # assumed 500 mV peak ADC full scale
    bottom_a = full_scale_a / 5000
    assert p.accuracy_range_a[0] == pytest.approx(bottom_a, rel=1e-9)
    assert not p.resolves
    turns = math.ceil(bottom_a / (2.7 / 230))
    assert any(f"ct.turns = {turns}" in x for x in p.remedies), p.remedies
    # the rounding of PL = 9.118 -> 9 is reported too
    assert any("rounds the meter constant" in x for x in p.problems)
    # and applying the turns resolves the range
    fixed = _board(tmp_path, f'ratio = 2000, burden_ohm = 1.0, turns = {turns}')
    q = plan_board(load_board(fixed), PlanOptions(load_w=(2.7, 9.5)))[0]
    assert not any("0.1 % range" in x for x in q.problems)


def test_headroom_at_the_cts_largest_current(tmp_path: Path) -> None:
    path = _board(tmp_path, 'ratio = 2000, burden_ohm = 100.0, max_current_a = 5.0')
    p = plan_board(load_board(path), PlanOptions(load_w=(2.7, 9.5)))[0]
    peak_mv = 5.0 / RATIO * BURDEN_OHM * 1000 * math.sqrt(2)
    assert p.headroom == pytest.approx(500.0 / peak_mv, rel=1e-9)


def test_meter_constant_tradeoff_in_output() -> None:
    result = CliRunner().invoke(meter, ["plan", str(REFERENCE), "--load-w", "2.7..9.5"])
    assert result.exit_code == 0, result.output
    # field drivers' 3200 imp/kWh: 0.1 pulse = 0.1 · 3.6e6 / 3200 J = 112.5 J per count
    assert "112.5 J/count" in result.output
    assert "PL 456 (rounding -0.0214 %)" in result.output
    assert result.output.count("resolves 2.7..9.5 W") == 4


@pytest.mark.parametrize("bad", ["9..2", "abc", "0..1", "1..inf", ""])
def test_bad_load_is_a_user_error(bad: str) -> None:
    result = CliRunner().invoke(meter, ["plan", str(REFERENCE), "--load-w", bad])
    assert isinstance(result.exception, UserError)
    assert str(result.exception).startswith("--load-w: ")


def test_bad_inputs_are_one_line_and_nonzero(tmp_path: Path) -> None:
    half = _board(tmp_path, "ratio = 2000, burden_ohm = 100.0, max_current_a = \"x\"")
    for args in (["--load-w", "9..2", str(REFERENCE)],
                 ["--load-w", "2.7..9.5", str(REPO / "hardware/epi-meter-bridge.toml")],
                 ["--load-w", "2.7..9.5", str(half)]):
        proc = subprocess.run([sys.executable, "-c", "from epi.cli import main; main()",
                               "meter", "plan", *args], capture_output=True, text=True,
                              cwd=REPO, timeout=120)
        assert proc.returncode != 0
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "Traceback" not in proc.stderr
    assert "ct.max_current_a" in proc.stderr


def test_an_overload_gets_less_signal_never_more(tmp_path: Path) -> None:
    """3000 W at 230 V draws 13.04 A; the ADC's assumed 500 mV peak at 50 mV per A (2000:1
    into 100 ohm) tops the range at 500 / (50·√2) = 7.07 A. The remedy used to be only "more
    signal" (the wrong direction): the burden must shrink by 13.04 / 7.07."""
    path = _board(tmp_path, "ratio = 2000, burden_ohm = 100.0")
    p = plan_board(load_board(path), PlanOptions(load_w=(300.0, 3000.0)))[0]
    assert any("above the top of the range" in x for x in p.problems)
    assert not any("more signal" in x or "turns =" in x for x in p.remedies), p.remedies
    top_a = 500.0 / (50.0 * math.sqrt(2))
    less = 3000.0 / 230.0 / top_a
    burden = f"a burden of {100.0 / less:.3g} ohm"
    assert any(burden in x and "less signal" in x for x in p.remedies), p.remedies
    assert any(f"ratio {2000.0 * less:.3g}:1" in x for x in p.remedies), p.remedies
    # and the burden it names brings 3000 W inside the range
    fixed = _board(tmp_path, f"ratio = 2000, burden_ohm = {100.0 / less * 0.999:.6f}")
    q = plan_board(load_board(fixed), PlanOptions(load_w=(300.0, 3000.0)))[0]
    assert not any("above the top of the range" in x for x in q.problems), q.problems


def test_an_overload_past_the_cts_rating_asks_for_another_ct(tmp_path: Path) -> None:
    path = _board(tmp_path, "ratio = 2000, burden_ohm = 100.0, max_current_a = 5.0")
    p = plan_board(load_board(path), PlanOptions(load_w=(2.7, 1500.0)))[0]
    # 1500 W / 230 V = 6.52 A: under the ADC's 7.07 A, over the CT's 5 A
    assert any(f"a CT rated for at least {1500 / 230:.3g} A" in x for x in p.remedies)
    assert not any("more signal" in x for x in p.remedies), p.remedies


def test_the_plan_prints_the_power_factor_it_assumes() -> None:
    """A Pi's supply at PF 0.6 draws 2.7 / (230 · 0.6) = 19.57 mA, not 11.74 mA."""
    result = CliRunner().invoke(meter, ["plan", str(REFERENCE), "--load-w", "2.7..9.5",
                                        "--pf", "0.6"])
    assert result.exit_code == 0, result.output
    assert f"at 2.7 W, 230 V, power factor 0.6 (--pf): {2.7 / (230 * 0.6) * 1000:.4g} mA" \
        in result.output
    default = CliRunner().invoke(meter, ["plan", str(REFERENCE), "--load-w", "2.7..9.5"])
    assert f"power factor 1 (--pf): {2.7 / 230 * 1000:.4g} mA" in default.output
