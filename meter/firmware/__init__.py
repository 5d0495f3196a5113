"""MicroPython firmware of the epi-meter board's RP2350: reads the four ATM90E26
chips over machine.SPI and streams telemetry lines over the UART to the orchestrator Pi.

Every module here is in the MicroPython subset (no typing imports, no dataclasses, no
f-string `=`) and runs unchanged on CPython (the emulated bridge) and on MicroPython.
"""
