"""Goals of the bench/ scripts: one entry per headline figure (see the BENCH line contract)."""

GOALS = {
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
}
