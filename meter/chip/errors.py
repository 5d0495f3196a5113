"""The meter's chip and bus exceptions, one hierarchy for the Pi's driver and the firmware.

Every fault of a chip or its bus is a `BusError` with a `kind`: the trace event kind it is
reported as (docs/formats.md), so the driver's daemon and the board firmware report the same
fault the same way. `detail` is the message; `recovered` says the chip was re-initialised
before the exception was raised; `reported` marks a fault already sent out as an event (a
caller that logs exceptions skips a duplicate). `ChipFault` is the firmware's name for it.

MicroPython subset (the firmware raises these): no annotations, no dataclasses.
"""


class BusError(Exception):
    """A register access failed or could not be verified, or the chip is not as configured."""

    kind = "bus_error"

    def __init__(self, message="", recovered=False):
        super().__init__(message)
        self.detail = message
        self.recovered = recovered
        self.reported = False


ChipFault = BusError


class BusTimeout(BusError):
    """The chip did not answer in time (UART), or a frame could not complete."""


class VerifyError(BusError):
    """A register access could not be confirmed by LastData within the retry budget."""


class ChipAbsentError(BusError):
    """No chip answers: every word reads 0xFFFF or 0x0000 (unplugged, unpowered, wrong CS)."""

    kind = "absent"


class ChipStuckError(BusError):
    """The chip answers the same word to every register and ignores writes."""


class ChipResetError(BusError):
    """The chip had reset (defaults back); re-initialised when `recovered`."""

    kind = "chip_reset"

    def __init__(self, message="chip reset", recovered=False):
        super().__init__(message, recovered)


class ChecksumError(BusError):
    """CalErr/AdjErr confirmed by CS1/CS2: a calibration block does not match its checksum
    (metering stopped or measurements frozen); re-initialised when `recovered`."""

    kind = "checksum_error"

    def __init__(self, message="checksum error", recovered=False):
        super().__init__(message, recovered)


class ImplausibleReadingError(BusError):
    """The measurement registers failed the plausibility checks twice in a row (a bit error or
    cut frame the LastData check cannot see, or a genuinely out-of-range mains): no reading."""

    kind = "implausible"


class CalibrationError(ValueError):
    """A calibration value the chip cannot hold, or a malformed calibration record."""
