"""The top of the report and its figures: the study's three questions answered in
words with decided/undecided status, the map's own layer groups in the results table, labels
that never overlap in the saved figure, a colour-blind-safe palette, alt text on every figure,
and the page in headless Chromium.

The study: 3 interleaved rounds of q4 and q8 (tests/host/test_analyze_validity.py), q8 drawing
3 % more power, scored on 200 items with q8 right on 10 more (McNemar p = 2/2¹⁰), both at
perplexity 20.0 / 20.1 (within the 1 % tolerance), and quantization manifests in which the two
maps differ only in their late group (Q4_0 → Q8_0). Expected figures come from that design:
a saving of 1 − 1/1.03 = 2.91 % for q4, a positive Δ J/token for the late group. The study is
analysed and its report written once per process (tests/host/report_fixtures.py); the tests
read them and change only in-memory copies.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path

import matplotlib.colors as mcolors
import numpy as np
import pytest
from matplotlib.collections import Collection
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from host.quant.mixmap import assign_layers, load_mixmap
from host.report import answers as answers_mod
from host.report import data as report_data
from host.report import figures as report_figures
from host.report import tables as report_tables
from host.report.browser import check_page
from host.report.build import Report
from host.report.label_layout import PointLabel, overlapping, place_labels
from host.report.layer_columns import layer_group_cells
from tests.host.report_fixtures import (  # noqa: F401  (fixtures)
    answered_report,
    answered_shared,
    report_files,
    study_analysis_shared,
)

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "out" / "test-artifacts"


def test_answer_block_names_configurations_figures_and_status(
        answered_shared: Path, answered_report: Report) -> None:  # noqa: F811
    rd = report_data.load(answered_shared)
    block = answers_mod.build(rd)
    by = {a.key: a for a in block.answers}
    # Q1: both on the frontier, neighbours told apart on energy (3 %) and accuracy (p=0.002)
    q1 = by["frontier"]
    assert q1.status == answers_mod.DECIDED
    assert re.search(r"2 of 2 configuration\(s\), cheapest first: q4 .*; q8 ", q1.text)
    assert "told apart on energy; told apart on accuracy" in q1.text
    # Q2: the perplexity-matched pair, with the saving the design puts in: 1 − 1/1.03
    q2 = by["perplexity"]
    assert q2.status == answers_mod.DECIDED and "q4 (perplexity 20.000) vs q8" in q2.text
    saving = float(re.search(r"saving (\S+) \[", q2.text).group(1))
    assert saving == pytest.approx(100 * (1 - 1 / 1.03), abs=0.05)
    assert "decided: different joules" in q2.text
    # Q3: the late group (the only one the maps differ in), q8 draws more: Δ > 0, decided
    q3 = by["layer_groups"]
    assert q3.status == answers_mod.DECIDED and "Only the late group is varied" in q3.text
    delta = float(re.search(r"changes J/token by (\S+) \[", q3.text).group(1))
    assert delta > 0
    assert "Q4_0→Q8_0 (q4 vs q8)" in q3.text
    # what the study cannot tell
    limits = " ".join(block.limits)
    assert "modelled, not measured" in limits
    # modelled power: no meter chain, so no qualification claim either way
    assert "no meter chain to qualify" in limits and "NOT qualified" not in limits
    assert "Accuracy is known only to ±0.07" in limits
    # the block sits at the top of both outputs, before the results table
    files = report_files(answered_report)  # render_files(answered_shared), as written
    md, html = files["report.md"].decode(), files["report.html"].decode()
    assert md.index("## Answers") < md.index("## How these figures were measured") < md.index(
        "## Results per configuration")
    assert html.index('id="answers"') < html.index('id="method"') < html.index('id="results"')
    for a in block.answers:
        assert f"*{a.status}.*" in md


def test_questions_the_study_cannot_answer_say_so(study_analysis_shared: tuple  # noqa: F811
                                                  ) -> None:
    block = answers_mod.build(report_data.load(study_analysis_shared[0]))
    by = {a.key: a for a in block.answers}
    assert by["layer_groups"].status == answers_mod.UNANSWERABLE
    assert "No two configurations differ in exactly one layer group" in by["layer_groups"].text
    assert "q2 had no valid run" in by["frontier"].text


# --------------------------------------------------------------------------- layer groups
@dataclass(frozen=True)
class G:
    """A manifest's layer group, as much of it as the report reads."""

    name: str
    layers: list[int]
    map_type: str | dict[str, str] | None


def _expanded(path: Path, n_layers: int) -> list[G]:
    """The map's groups applied to a model of n_layers, as `epi quantize` records them."""
    m = load_mixmap(path)
    return [G(name, layers, next(g.type for g in m.groups if g.name == name))
            for name, layers in assign_layers(m, n_layers)]


def test_layer_columns_come_from_the_maps_own_groups() -> None:
    # demo_bookend_q8_q4_q8 on SmolLM2's 30 layers: the late group is 23-29, all Q8_0
    cells = layer_group_cells(_expanded(REPO / "quantmaps/demo/demo_bookend_q8_q4_q8.json",
                                        30), 30)
    assert cells == {"early": "Q8_0 (0-7)", "middle": "Q4_0 (8-22)", "late": "Q8_0 (23-29)"}
    # a paper-form map: the paper's own layer lists
    cells = layer_group_cells(_expanded(REPO / "quantmaps/paper/mix_q4_q3_q6.json", 32), 32)
    assert cells == {"early": "Q4_K_M (0-7)", "middle": "Q3_K_S (8-23)", "late": "Q6_K (24-31)"}
    # one group: the same type everywhere
    one = [G("all", list(range(30)), "Q4_0")]
    assert set(layer_group_cells(one, 30).values()) == {"Q4_0 (0-29)"}
    # groups of other names (a search map): each quarter lists its layers by range
    search = [G("g0", [0, 1, 2], "Q8_0"), G("g1", list(range(3, 30)), "Q4_0")]
    assert layer_group_cells(search, 30)["early"] == "0-2:Q8_0 3-7:Q4_0"
    assert layer_group_cells(search, 30)["late"] == "22-29:Q4_0"  # a quarter of 30: 8 layers
    # the non-block group (no layers) is not a layer group
    assert layer_group_cells([G("non_block", [], {"output": "Q8_0"})], 30) == \
        dict.fromkeys(("early", "middle", "late"), "?")


def test_results_table_shows_each_configs_own_groups(answered_shared: Path  # noqa: F811
                                                     ) -> None:
    rows = {r[0]: r for r in report_tables.results_table(report_data.load(answered_shared)).rows}
    assert rows["q4"][1:4] == ["Q4_0 (0-1)", "Q4_0 (2-5)", "Q4_0 (6-7)"]
    assert rows["q8"][1:4] == ["Q4_0 (0-1)", "Q4_0 (2-5)", "Q8_0 (6-7)"]


# --------------------------------------------------------------------------- figures
def _saved(fig) -> None:
    """Lay the figure out as the report saves it (tight bounding box, PNG)."""
    fig.savefig(io.BytesIO(), format="png", dpi=110, bbox_inches="tight")


def test_labels_never_overlap_in_the_saved_figure(answered_shared: Path) -> None:  # noqa: F811
    rd = report_data.load(answered_shared)  # changed below in memory only
    res = rd.results
    head = (res["scope"] == "all") & (res["phase"] == "request") & (res["basis"] == "gross")
    q4 = res[head & (res["config"] == "q4")].iloc[0]
    # two configurations at the same accuracy and almost the same J/token
    res.loc[head & (res["config"] == "q8"), "accuracy"] = q4["accuracy"]
    res.loc[head & (res["config"] == "q8"), "j_per_token_median"] = \
        q4["j_per_token_median"] * 1.0005
    for build in (report_figures.accuracy_vs_energy, report_figures.energy_vs_size):
        f = build(rd)
        _saved(f.fig)
        for ax in f.fig.axes:
            assert overlapping(ax) == [], (f.key, overlapping(ax))
        texts = [t.get_text() for ax in f.fig.axes for t in ax.texts]
        assert "q4" in texts and "q8" in texts


@pytest.mark.long
def test_label_placer_separates_crowded_points() -> None:
    import matplotlib.pyplot as plt

    rng = np.random.default_rng(7)
    for trial in range(5):
        fig, ax = plt.subplots(figsize=(6, 4))
        n = 12
        xs = np.clip(1 + rng.normal(0, 0.01 * (trial + 1), n), 0.91, 1.09)
        ys = np.clip(0.5 + rng.normal(0, 0.01 * (trial + 1), n), 0.41, 0.59)
        ax.plot(xs, ys, "o")
        ax.set_xlim(0.9, 1.1)
        ax.set_ylim(0.4, 0.6)
        place_labels(ax, [PointLabel(x, y, f"config_{i}") for i, (x, y) in
                          enumerate(zip(xs, ys, strict=True))])
        _saved(fig)
        assert overlapping(ax) == []
        assert len(ax.texts) == n
        plt.close(fig)


def _grey(rgb: tuple[float, float, float]) -> bool:
    return max(rgb) - min(rgb) < 1e-6


def test_figures_use_the_colour_blind_safe_palette_and_carry_alt_text(
        answered_shared: Path, answered_report: Report) -> None:  # noqa: F811
    rd = report_data.load(answered_shared)
    allowed = {mcolors.to_rgb(c) for c in report_figures.OKABE_ITO}
    for f in report_figures.build_all(rd):
        used = set()
        for art in f.fig.findobj(lambda a: isinstance(a, Line2D | Patch | Collection)):
            if isinstance(art, Line2D):
                cols = [art.get_color(), art.get_markerfacecolor(), art.get_markeredgecolor()]
            elif isinstance(art, Patch):
                cols = [art.get_facecolor(), art.get_edgecolor()]
            else:
                cols = [tuple(c) for c in art.get_facecolor()] + [
                    tuple(c) for c in art.get_edgecolor()]
            for c in cols:
                if isinstance(c, str) and c == "none":
                    continue
                rgba = mcolors.to_rgba(c)
                if rgba[3] == 0:
                    continue
                used.add(rgba[:3])
        off = {c for c in used if c not in allowed and not _grey(c)}
        assert not off, (f.key, [mcolors.to_hex(c) for c in off])
        # alt text: says what the figure shows, with the configurations' figures
        one = f.key == "power_trace"  # one request of one configuration
        assert len(f.alt) > 60 and ("q4" in f.alt or one) and ("q8" in f.alt or one), f.alt
    html = answered_report.html.read_text()  # render_files(answered_shared), as written
    alts = re.findall(r'<img alt="([^"]*)"', html)
    assert len(alts) == 7 and all(len(a) > 60 for a in alts)


def test_epi_figure_uses_a_log_axis_so_a_wide_interval_leaves_others_readable(
        answered_shared: Path) -> None:  # noqa: F811
    rd = report_data.load(answered_shared)  # changed below in memory only
    res = rd.results
    head = (res["scope"] == "all") & (res["phase"] == "request") & (res["basis"] == "gross")
    res.loc[head & (res["config"] == "q8"), "epi_ci_hi"] = 11.8  # one very wide interval
    f = report_figures.epi_sorted(rd)
    ax = f.fig.axes[0]
    assert ax.get_xscale() == "log"
    _saved(f.fig)
    # every point sits clear of the axis' first 5 %: none is squashed against the origin
    lo, hi = (np.log10(v) for v in ax.get_xlim())
    for line in ax.lines:
        for x in line.get_xdata():
            assert (np.log10(x) - lo) / (hi - lo) > 0.05
    assert "log horizontal axis" in f.caption


def test_phase_energy_is_in_joules(answered_shared: Path) -> None:  # noqa: F811
    rd = report_data.load(answered_shared)
    f = report_figures.phase_energy(rd)
    assert "J" in f.fig.axes[0].get_ylabel() and "mJ" not in f.fig.axes[0].get_ylabel()
    bd = {b["config"]: b for b in rd.doc["phase_breakdown"]}
    top = max(p.get_height() for p in f.fig.axes[0].patches)
    assert top == pytest.approx(max(max(b["prefill_mj"], b["decode_mj"], b["idle_mj"])
                                    for b in bd.values()) / 1e3, rel=0.6)


@pytest.mark.long
@pytest.mark.serial  # Chromium's processes use both cores (see test_report.py)
def test_report_page_in_headless_chromium_shows_answers_and_alt_text(
        answered_report: Report) -> None:  # noqa: F811
    page = check_page(answered_report.html)
    answers = page.sections.get("answers", "")
    for q in ("frontier", "perplexity", "layer groups"):
        assert q in answers
    assert answers.count("decided") >= 3 and "What this study cannot tell" in answers
    assert "How these figures were measured" in page.sections.get("method", "")
    assert len(page.images) == 7
    for img in page.images:
        assert img["complete"] and img["natural_width"] > 200 and len(img["alt"]) > 60, img
    assert page.console_errors == []
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "report-answers-screenshot.png").write_bytes(page.screenshot_png)


def test_the_per_phase_figure_states_one_basis_under_a_net_analysis(
        answered_shared: Path) -> None:  # noqa: F811
    """The stacked phases are gross energy; a net analysis must not stamp or caption the same
    figure 'net' beside its gross axis."""
    import dataclasses

    rd = report_data.load(answered_shared)
    rd = dataclasses.replace(rd, labels=dataclasses.replace(rd.labels, energy_basis="net"))
    f = report_figures.phase_energy(rd)
    ax = f.fig.axes[0]
    texts = [ax.get_ylabel(), f.caption, *(t.get_text() for t in ax.texts)]
    assert all("net" not in t.replace("net request", "") for t in texts), texts
    assert "gross" in ax.get_ylabel() and "gross energy]" in f.caption


def test_the_whole_model_is_never_ranked_as_a_layer_group(answered_shared: Path) -> None:  # noqa: F811
    """A map whose only group is `all` differs from another in the whole model: the answer
    must not call it a layer group, nor rank it beside one."""
    from host.report import answers as answers_mod

    rd = report_data.load(answered_shared)
    diff = rd.doc["layer_groups"]["differential"]
    whole = {**diff[0], "group": "all", "delta_j_per_token": 10 * diff[0]["delta_j_per_token"]}
    rd.doc["layer_groups"]["differential"] = [whole, *diff]
    text = answers_mod.layer_group_answer(rd).text
    assert "all group" not in text and "Largest effect: the all" not in text
    assert "late" in text
    rd.doc["layer_groups"]["differential"] = [whole]
    only = answers_mod.layer_group_answer(rd)
    assert "No layer group is varied on its own" in only.text


def _neighbours_undecided_on_accuracy(rd: report_data.ReportData, delta: float, n_items: int,
                                      discordant: int) -> None:
    for r in rd.doc["comparisons"]:
        if r["comparison"] == "frontier neighbours":
            r.update({"accuracy_delta": delta, "accuracy_distinguishable": False,
                      "accuracy_n_items": n_items, "accuracy_discordant": discordant})


def test_an_undecided_frontier_pair_says_how_many_items_would_decide_it(
        answered_shared: Path) -> None:  # noqa: F811
    """Neighbours told apart on energy but not on accuracy: the answer names the item count
    that would tell them apart. Δ = 0.03 on 30 discordant of 200 items (ψ = 0.15), written
    out: (1.959964·√0.15 + 0.841621·√(0.15 − 0.0009))² / 0.0009 = 1305.8 → 1306."""
    rd = report_data.load(answered_shared)
    _neighbours_undecided_on_accuracy(rd, 0.03, 200, 30)
    q1 = answers_mod.frontier_answer(rd)
    assert q1.status == answers_mod.UNDECIDED
    assert "not told apart on accuracy; what would decide it: about 1306 paired accuracy " \
           "items (80 % power at the observed difference; 200 scored)." in q1.text


def test_a_frontier_pair_with_no_accuracy_difference_says_none_follows(
        answered_shared: Path) -> None:  # noqa: F811
    rd = report_data.load(answered_shared)
    _neighbours_undecided_on_accuracy(rd, 0.0, 200, 14)
    q1 = answers_mod.frontier_answer(rd)
    assert q1.status == answers_mod.UNDECIDED
    assert "differ on 14 items with no net difference, so they may be equally accurate" \
        in q1.text
