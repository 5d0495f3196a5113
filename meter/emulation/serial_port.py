"""What the emulated pyserial ports (`emuchip://`, `emumcu://`) share: the URL's name part,
and the parts of pyserial's port API that have nothing to do on a wire with no modem lines
and no output buffer. Each handler adds its far end and its byte timing."""

from __future__ import annotations

from serial.serialutil import SerialBase, SerialException


class EmulatedSerial(SerialBase):
    """Base of the emulated ports; `SCHEME` is the URL prefix, e.g. ``"emuchip://"``."""

    SCHEME = ""
    is_open: bool  # set by SerialBase.__init__ (pyserial ships no type information)

    def _far_end_name(self) -> str:
        """NAME of `SCHEME` + NAME; SerialException if the port is open or the URL is foreign."""
        if self.is_open:
            raise SerialException("Port is already open.")
        url = str(self.port)
        if not url.lower().startswith(self.SCHEME):
            raise SerialException(f"expected {self.SCHEME}NAME, got {url!r}")
        return url[len(self.SCHEME):]

    def _reconfigure_port(self, *args: object, **kwargs: object) -> None:
        """Nothing to configure: the far end reads the baud rate itself."""

    def reset_output_buffer(self) -> None:
        """Writes are delivered at once; nothing is buffered."""

    def flush(self) -> None:
        """Writes are delivered at once; nothing to wait for."""

    def _update_dtr_state(self) -> None:
        """No modem lines."""

    def _update_rts_state(self) -> None:
        """No modem lines."""
