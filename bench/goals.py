"""Goals of the benchmark figures (each bench prints `BENCH {...}` lines against these)."""

GOALS = {
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
}
