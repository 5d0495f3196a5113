"""Goals of the bench/ scripts: one entry per headline figure (see the BENCH line contract)."""

GOALS = {
    "campaign-overhead-per-run-s": {
        "goal": 1.0,
        "text": "seconds a campaign run step takes beyond the same `epi run` invoked directly "
                "(journal, spec, process session, result), median over runs, tiny model",
    },
    "report-render-s": {
        "goal": 30.0,
        "text": "seconds `epi report` needs to render an analysis (6 figures as PNG + SVG, "
                "HTML + Markdown) of a small campaign, median of repeated renders",
    },
}
