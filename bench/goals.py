"""Goals of the bench/ scripts: one entry per headline figure (see the BENCH line contract)."""

GOALS = {
    "sampler-daemon-bus-fraction": {
        "goal": 0.9,
        "text": "sweeps per second the daemon achieves on its real bus path (EmulatedSpiBus "
                "with 160 kHz wire time, system clock, sampler + driver + trace writer) as a "
                "fraction of the wire-time limit",
    },
    "sampler-soak-lost-fraction": {
        "goal": 0.0,
        "text": "fraction of scheduled reads neither written nor reported (late/skipped/failed "
                "/not ready) in a soak on the system clock at the daemon's default rate",
    },
    "fault-soak-energy-error": {
        "goal": 0.002,
        "text": "per-channel energy outside [P·(t - unmetered), P·t], relative to P·t, max over "
                "4 channels, daemon on the system clock with every fault kind in turn",
    },
    "fault-soak-unexplained-rows": {
        "goal": 0,
        "text": "rows more than 1 % off the constant load (or 0 W) with no event explaining "
                "them within 2 s, same soak",
    },
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
