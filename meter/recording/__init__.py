"""The recording session: the one set-up under every way of filling a trace (chips, MCU
bridge, software counters)."""
