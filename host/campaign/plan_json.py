"""`epi campaign --dry-run --json`: the plan, its time estimate and the preflight as one
document (docs/campaign.md, "The plan as JSON"), for scripts that schedule a study."""

from __future__ import annotations

from host.campaign.plan import Plan
from host.campaign.preflight import Finding

PLAN_FORMAT, PLAN_VERSION = "epi-campaign-plan", 1


def plan_document(plan: Plan, done: set[str], findings: list[Finding]) -> dict[str, object]:
    """Every step with its estimate (null where there is no basis for one), the seconds
    left by step kind, and each preflight finding."""
    st = plan.study
    left = [s for s in plan.steps if s.step_id not in done]
    by_kind: dict[str, float] = {}
    for s in left:
        by_kind[s.kind] = by_kind.get(s.kind, 0.0) + s.estimate_s
    return {
        "format": PLAN_FORMAT, "format_version": PLAN_VERSION,
        "study": {"name": st.name, "path": str(st.path), "out": str(st.out), "seed": st.seed},
        "configurations": [{"config_id": c.config_id, "model": c.model,
                            "map": str(c.map_path) if c.map_path else None,
                            "gguf": str(c.gguf)} for c in plan.configs],
        "steps": [{"step_id": s.step_id, "kind": s.kind, "config": s.config, "round": s.round,
                   "estimate_s": s.estimate_s if s.estimate_known else None,
                   "detail": s.detail, "done": s.step_id in done} for s in plan.steps],
        "estimate_left_s": sum(by_kind.values()),
        "estimate_left_by_kind_s": by_kind,
        "steps_without_estimate": sum(1 for s in left if not s.estimate_known),
        "accuracy_per_configuration_s": plan.accuracy.seconds if plan.accuracy else None,
        "preflight": [{"check": f.check, "ok": f.ok, "detail": f.detail, "fix": f.fix or None}
                      for f in findings],
        "preflight_problems": sum(1 for f in findings if f.ok is False),
    }
