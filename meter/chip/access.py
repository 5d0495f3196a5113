"""Verified register access to an ATM90E26 (application note §4.3), over an abstract transport.

`VerifiedAccess` moves words through two callables, `read_word(address) -> word or None`
(None: the transport itself saw the access fail) and `write_word(address, word) -> bool`, and
confirms each access through LastData (06H):

- a read: the target read and the LastData read must agree; on a mismatch LastData is read
  again, and an ordinary register is simply re-read;
- a read-clear register (SysStatus, energy) is never re-read once the chip may have cleared
  it: its value is recovered from LastData. Every read-clear read follows a verified access
  whose word is known (the *sentinel*): LastData still holding it means the frame never
  reached the chip (a cut frame, a lost UART request), so the read may be repeated;
- a write: LastData must show the value; when it already does, a different register is read
  first, so a dropped write cannot pass.

Failures raise `VerifyError`, or `ChipAbsentError` when nothing but 0000H/FFFFH or no answer
came back. Part of the chip protocol (`meter.chip.protocol`); MicroPython subset.
"""

from meter.chip import registers as regs
from meter.chip.errors import ChipAbsentError, VerifyError

ABSENT_WORDS = (0x0000, 0xFFFF)
SENTINEL_CANDIDATES = (regs.CAL_START, regs.FUNC_EN, regs.ADJ_START, regs.address("MMode"))
ACCESS_STATS = ("reads", "writes", "read_retries", "write_retries", "lastdata_recoveries",
                "verify_failures")


def hexword(word):
    # type: (int | None) -> str
    return "no answer" if word is None else "0x%04X" % word


def reg_name(address):
    # type: (int) -> str
    r = regs.BY_ADDRESS.get(address)
    return "%s (%02XH)" % (r.name, address) if r is not None else "%02XH" % address


class VerifiedAccess:
    """LastData-verified reads, read-clear reads and writes of one chip (module docstring).

    `now()` stamps read-clear reads (`t_read_clear`, in the caller's ticks); `stats` counts
    accesses.
    """

    def __init__(self, read_word, write_word, now, retries=5):
        self.read_word = read_word
        self.write_word = write_word
        self.now = now
        self.retries = max(1, retries)
        self.last_data = None  # type: int | None  # what LastData holds after our last access
        self.t_read_clear = 0  # type: int  # when the last read-clear read reached the chip
        self.read_clear_other = None  # type: int | None  # the word read, LastData said otherwise
        # LastData words seen before it settled on another (a LastData read a MOSI bit error
        # redirected to another register overwrites LastData: the cleared word may be here)
        self.read_clear_seen = []  # type: list[int]
        # words of read attempts LastData did not confirm (a read a bit error redirected to a
        # read-clear register cleared it: its word is here; the caller empties the list)
        self.unconfirmed = []  # type: list[int]
        # LastData reads that disagreed with the word read (bit errors on the bus; the caller
        # sets it to 0 at each reading)
        self.disagreements = 0  # type: int
        self.stats = {}  # type: dict[str, int]
        for key in ACCESS_STATS:
            self.stats[key] = 0

    def read(self, address):
        # type: (int) -> int
        """A register word confirmed by LastData (read-clear registers: `read_clear`)."""
        r = regs.BY_ADDRESS.get(address)
        if r is not None and r.read_clear:
            return self.read_clear(address)
        self.stats["reads"] += 1
        seen = []  # type: list
        for attempt in range(self.retries):
            if attempt:
                self.stats["read_retries"] += 1
            v = self.read_word(address)
            l1 = self.read_word(regs.LAST_DATA)
            if v is not None and v == l1:
                self.last_data = v
                return v
            self.disagreements += 1
            l2 = self.read_word(regs.LAST_DATA)
            if v is not None and l2 == v:
                self.last_data = v
                return v
            seen.append((v, l1, l2))
            for w in (v, l1, l2):
                if w is not None:
                    self.unconfirmed.append(w)
        self.stats["verify_failures"] += 1
        self.last_data = None
        if all_absent([w for attempt in seen for w in attempt]):
            raise ChipAbsentError("%s: no answer from the chip (%d tries)"
                                  % (reg_name(address), len(seen)))
        last = seen[-1]
        raise VerifyError("%s: read not confirmed by LastData (last try: read %s, LastData "
                          "%s then %s)" % (reg_name(address), hexword(last[0]),
                                           hexword(last[1]), hexword(last[2])))

    def read_clear(self, address):
        # type: (int) -> int
        """A read-clear register, never re-read once the chip may have cleared it."""
        self.stats["reads"] += 1
        self.read_clear_other = None
        self.read_clear_seen = []
        sentinel = self.ensure_sentinel()
        v = None
        lastdata = []  # type: list
        for attempt in range(self.retries):
            if attempt:
                self.stats["read_retries"] += 1
            v = self.read_word(address)
            self.t_read_clear = self.now()
            lastdata = []
            executed = True
            for _ in range(self.retries + 1):
                last_data = self.read_word(regs.LAST_DATA)
                if last_data is None:
                    continue
                if v is not None and last_data == v:
                    self.last_data = v
                    if lastdata:
                        self.stats["lastdata_recoveries"] += 1
                    return v
                self.disagreements += 1
                if last_data in lastdata:  # LastData is stable at last_data
                    if last_data == sentinel:
                        executed = False  # the read never reached the chip: nothing cleared
                        if v is not None:
                            # unless a redirected LastData read wrote the sentinel's word
                            # back (0000H is common): then v may be the cleared word
                            self.unconfirmed.append(v)
                        break
                    self.last_data = last_data
                    self.stats["lastdata_recoveries"] += 1
                    # v was garbled on MISO, or a redirected LastData read overwrote LastData
                    # with another register's word: keep v, and the LastData words seen
                    # before it settled, for the energy check
                    self.read_clear_other = v
                    self.read_clear_seen = [w for w in lastdata if w != last_data]
                    return last_data
                lastdata.append(last_data)
            if executed:
                break  # LastData never settled: the cleared value is unknowable
        self.stats["verify_failures"] += 1
        self.last_data = None
        if all_absent(lastdata) and all_absent([v]):
            raise ChipAbsentError("%s: no answer from the chip" % reg_name(address))
        raise VerifyError("%s: read-clear value not recoverable from LastData (read %s, "
                          "LastData %s)" % (reg_name(address), hexword(v),
                                            ", ".join(hexword(x) for x in lastdata)
                                            or "no answer"))

    def ensure_sentinel(self):
        # type: () -> int | None
        """Make sure LastData holds a known word before a read-clear read; return it."""
        if self.last_data is None:
            self.read(regs.CAL_START)
        return self.last_data

    def write(self, address, value):
        # type: (int, int) -> None
        """Write a word and confirm it through LastData (re-writing if it did not land)."""
        value &= 0xFFFF
        self.stats["writes"] += 1
        if self.last_data is None or self.last_data == value:
            self._make_lastdata_differ(value)
        seen = []  # type: list
        answered = False
        for attempt in range(self.retries):
            if attempt:
                self.stats["write_retries"] += 1
            if self.write_word(address, value):
                answered = True
            else:
                seen.append("no answer")
            l1 = self.read_word(regs.LAST_DATA)
            if l1 == value:
                self.last_data = value
                return
            l2 = self.read_word(regs.LAST_DATA)
            if l2 == value:
                self.last_data = value
                return
            seen.append("LastData %s/%s" % (hexword(l1), hexword(l2)))
            answered = answered or l1 is not None or l2 is not None
            if l1 is not None and l1 == l2 and l1 != value:
                self.last_data = l1
        self.stats["verify_failures"] += 1
        self.last_data = None
        if not answered:
            raise ChipAbsentError("%s <- 0x%04X: no answer from the chip"
                                  % (reg_name(address), value))
        raise VerifyError("%s <- 0x%04X: write not confirmed (%s)"
                          % (reg_name(address), value, "; ".join(seen[-3:])))

    def _make_lastdata_differ(self, value):
        # type: (int) -> None
        for address in SENTINEL_CANDIDATES:
            try:
                if self.read(address) != value:
                    return
            except VerifyError:
                continue
        # every candidate holds `value` (or cannot be read): the write check may pass falsely
        self.last_data = None


def all_absent(words):
    # type: (list) -> bool
    """Whether every word is no answer (None) or what an absent chip's MISO gives."""
    return all(w is None or w in ABSENT_WORDS for w in words)
