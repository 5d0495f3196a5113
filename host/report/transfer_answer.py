"""The report's answer on transfer: does a map's rank on one model hold on another?

Asked only when the study measured the same maps on two models (host/analysis/transfer.py has
the statistics). A configuration's model is the base its quantization manifest names (a base
model's own file is its own model), and its map is the manifest's map id, so the campaign's
per-model configuration ids (`MAP.MODEL` when a map serves several models) pair up. Each round's
value is the configuration's whole-request J per generated token on the report's basis (the
mean of that run's valid repeats); EPI divides it by the configuration's accuracy, a constant
per configuration, so the two rankings share one set of rounds.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from epi.core.errors import UserError
from epi.formats.manifests import QuantManifest
from host.analysis.headline import headline_rows
from host.analysis.intervals import finite as _finite
from host.analysis.intervals import number
from host.analysis.transfer import Transfer, rows_by_round, sign_flip_rounds_needed, transfer
from host.report.answer_model import DECIDED, UNDECIDED, Answer
from host.report.data import ReportData, _manifest_for

QUESTION = ("Does the ranking of the maps transfer across models (does mixed quantization "
            "interact with the model, e.g. with expert gating)?")


def model_and_map(rd: ReportData) -> dict[str, tuple[str, str]]:
    """config → (model, map id) from each configuration's manifest; configurations without a
    quantization manifest are left out (their map is unknown)."""
    out: dict[str, tuple[str, str]] = {}
    manifest_dir = (rd.doc.get("options") or {}).get("manifest_dir")
    for run in rd.doc.get("runs") or []:
        cfg, model = run.get("config"), run.get("model") or {}
        if not isinstance(cfg, str) or cfg in out or not isinstance(model, dict):
            continue
        try:
            man = _manifest_for(model, manifest_dir)
        except UserError:
            continue
        if isinstance(man, QuantManifest) and man.base is not None:
            out[cfg] = (Path(man.base.path).stem, man.map_id)
    return out


def _round_values(rd: ReportData, keys: Mapping[str, tuple[str, str]],
                  accuracy: Mapping[str, float] | None
                  ) -> dict[str, dict[str, dict[int, float]]]:
    r = rd.repeats
    need = {"config", "scope", "phase", "unit", "basis", "j_per_token", "campaign_round"}
    if r.empty or not need <= set(r.columns):
        return {}
    rows = headline_rows(r, rd.basis)
    if "reason" in rows.columns:
        rows = rows[rows["reason"].isna() | (rows["reason"].astype(str) == "")]
    out = []
    for _, row in rows.iterrows():
        cfg = str(row["config"])
        if cfg not in keys or not _finite(row["j_per_token"]) or \
                not _finite(row["campaign_round"]):
            continue
        value = number(row["j_per_token"])
        if accuracy is not None:
            if cfg not in accuracy:
                continue
            value /= accuracy[cfg]
        model, map_id = keys[cfg]
        out.append((model, map_id, int(number(row["campaign_round"])), value))
    return rows_by_round(out)


def _accuracy(rd: ReportData) -> dict[str, float]:
    h = rd.headline()
    if "accuracy" not in h.columns:
        return {}
    return {str(c): number(h.loc[c, "accuracy"]) for c in h.index
            if _finite(h.loc[c, "accuracy"]) and number(h.loc[c, "accuracy"]) > 0}


def _words(t: Transfer, figure: str) -> str:
    lvl = f"{t.level:.0%}"
    stats = (f"{figure}: Spearman ρ {t.rho:+.2f} [{t.rho_ci[0]:+.2f}, {t.rho_ci[1]:+.2f}] "
             f"({lvl} bootstrap over {t.n_rounds} paired rounds, approximate coverage), "
             f"map × model interaction p = {t.interaction_p:.3g} (sign-flip test over rounds)")
    if t.answer == "the ranking transfers":
        return f"The ranking transfers between {t.models[0]} and {t.models[1]} ({stats})."
    if t.answer == "it does not":
        return (f"It does not: these maps move between {t.models[0]} and {t.models[1]}: "
                f"{', '.join(t.moved)} ({stats}).")
    need = sign_flip_rounds_needed(t.n_rounds)
    more = (f"at least {need} paired rounds (the test cannot reject with fewer)"
            if need > t.n_rounds else "more paired rounds or maps further apart")
    return f"Undecided ({stats}); what would decide it: {more}."


def transfer_answer(rd: ReportData) -> Answer | None:
    """The answer, or None when the study has fewer than two models with common maps."""
    keys = model_and_map(rd)
    if len({m for m, _ in keys.values()}) < 2:
        return None
    models = sorted({m for m, _ in keys.values()})[:2]
    keys = {c: k for c, k in keys.items() if k[0] in models}
    j = transfer(_round_values(rd, keys, None))
    if j is None:
        common = set.intersection(*({mp for mo, mp in keys.values() if mo == m} for m in models))
        return Answer("transfer", QUESTION, f"{len(common)} map(s) measured on both "
                      f"{models[0]} and {models[1]} with valid paired rounds: a ranking needs "
                      "at least 3 maps in at least 2 common rounds (what would decide it: "
                      "measure the same maps on both models).", UNDECIDED)
    text = _words(j, "J/token")
    acc = _accuracy(rd)
    e = transfer(_round_values(rd, keys, acc)) if acc else None
    statuses = [j.status] + ([e.status] if e is not None else [])
    if e is not None:
        text += " " + _words(e, "EPI")
    else:
        text += " EPI: no accuracy for these maps, so only J/token is ranked."
    status = DECIDED if all(s == DECIDED for s in statuses) else UNDECIDED
    return Answer("transfer", QUESTION, text, status)



