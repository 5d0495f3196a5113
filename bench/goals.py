"""Goals of the benchmark figures (bench/*.py print them in their BENCH lines)."""

GOALS = {
    "trace-read-stdlib-vs-read_csv": {
        "goal": 15.0,
        "text": "the checked stdlib trace reader takes at most 15x the time of a bare "
                "pandas.read_csv of the samples (pure Python on the meter side)",
    },
    "trace-read-view-vs-read_csv": {
        "goal": 20.0,
        "text": "the analysis's trace view (reader + frames + invalid intervals) takes at most "
                "20x a bare pandas.read_csv of the samples",
    },
}
