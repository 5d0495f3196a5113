"""Where a campaign keeps things: everything under the study's `out` directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from host.campaign.plan import Step


@dataclass(frozen=True)
class Layout:
    """The campaign directory's parts (all under `root`)."""

    root: Path

    @property
    def trace(self) -> Path:
        return self.root / "trace"

    @property
    def analysis(self) -> Path:
        return self.root / "analysis"

    @property
    def report(self) -> Path:
        return self.root / "report"

    @property
    def report_html(self) -> Path:
        return self.report / "report.html"

    @property
    def accuracy(self) -> Path:
        return self.root / "accuracy.json"

    def step_dir(self, step_id: str) -> Path:
        return self.root / "steps" / step_id.replace(":", "_").replace("/", "_")

    def run_dir(self, step: Step, attempt: int) -> Path:
        """runs/<config>/round<k>-attempt<j>, or round<k>-take<t>-attempt<j> for a run that
        re-measures a refused one (host/campaign/remeasure.py)."""
        take = f"-take{step.take}" if step.take > 1 else ""
        return (self.root / "runs" / str(step.config)
                / f"round{step.round}{take}-attempt{attempt}")
