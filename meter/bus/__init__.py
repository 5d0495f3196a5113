"""Buses to an ATM90E26: one small interface (`meter.bus.base.Bus`), several implementations.

- `spidev_bus.SpidevBus`: Linux spidev with the kernel driving chip-select (CE0/CE1).
- `gpio_cs_bus.GpioCsSpiBus`: spidev with chip-select lines driven by gpiozero (4 chips on 2 CEs).
- `uart_bus.UartBus`: the chip's own UART mode over pyserial.
- `meter.emulation.emulated_bus.EmulatedSpiBus` (and `EmulatedSpidev`, a spidev stand-in):
  the register-level emulator, outside this package since it is not hardware.

A bus reports only what it sees itself (timeouts, bad UART checksums) as `meter.errors.BusError`;
the chip protocol (`meter.chip.protocol`) adds LastData verification on top. Hardware modules
(spidev, gpiozero, serial) are imported only by the bus that needs them.
"""
