"""The Pi side of the MCU firmware bridge: the epi-meter board's RP2350 streams the
chips' readings over a UART; this package decodes the lines, maps MCU time to the Pi's
CLOCK_MONOTONIC and records the same epi-trace format as direct SPI, labelled bridged."""
