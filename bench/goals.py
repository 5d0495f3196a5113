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
    "sources-read-cost-rapl-us": {
        "goal": 1000.0,
        "text": "one RAPL read (package + DRAM energy_uj) costs under 1 ms, so 20 Hz polling "
                "takes under 2 % of a core",
    },
    "sources-read-cost-hwmon-us": {
        "goal": 1000.0,
        "text": "one hwmon read (every power/energy attribute) costs under 1 ms",
    },
    "sources-read-cost-nvml-binding-us": {
        "goal": 500.0,
        "text": "epi's own ctypes overhead per NVML read (fake library) is small next to the "
                "~3.8 ms an nvmlDeviceGetTotalEnergyConsumption call takes on an H100",
    },
    "sources-achieved-over-update-rate-nvml": {
        "goal": [0.8, 1.05],
        "text": "rows per second of a 10 Hz counter polled on its own thread, over its update "
                "rate: close to 1, and never above (never faster than the counter updates)",
    },
    "sources-poll-over-update-rate-slow-hwmon": {
        "goal": 1.5,
        "text": "a sensor that updates once a second, first polled at 10 Hz: after adapting, "
                "polls per second over updates per second at most 1.5",
    },
    "sources-wall-sweep-lateness-ratio": {
        "goal": 2.0,
        "text": "p99 lateness of the wall meter's sweeps with a slow source (40 ms reads) "
                "recorded beside it, over without: at most 2 (sources run on their own threads)",
    },
    "bridge-sweep-rate-fraction": {
        "goal": 0.9,
        "text": "sustained sweep rate through the MCU bridge as a fraction of the lesser of the "
                "SPI-limited and UART-limited rates (115200 and 921600 baud, JSON and compact)",
    },
    "bridge-clock-map-error-ms": {
        "goal": 1.0,
        "text": "MCU -> Pi CLOCK_MONOTONIC mapping error against the injected truth, 50 ppm "
                "drift and jittered latency, max over the samples after the first minute (ms)",
    },
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
