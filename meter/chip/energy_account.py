"""The energy account of one ATM90E26: ATenergy counts checked, unwrapped and split from their
reverse part, accumulated in an int that never wraps. MicroPython subset.

The chip protocol (`meter.chip.protocol.Protocol`) owns one `EnergyAccount` and reads each
window's ATenergy word; the account decides what of it is counted (module docstring of
`meter.chip.protocol`, "Energy"): counts above the hard bound, outside what the Pmean before
and after the window allow (`meter.chip.energy_window`), or equal to another register's word
of the reading, are re-read once through the chip; a long gap is unwrapped; ANenergy (reverse
active) is read right after and kept apart in `reverse_counts`. Intervals the chip could not
meter are kept in `unmetered` with an estimate at the last power.

It reads the chip through the protocol it belongs to: `read_clear` and what the access layer
recorded of that read (`t_read_clear`, `read_clear_other`), `event` and `stats`, `seconds`,
the calibration, limits and register quanta, and the reading's `rejected`, `unconfirmed` and
`known_words` (words a redirected read may have returned).
"""

from meter.chip import energy_window, plausibility
from meter.chip import registers as regs
from meter.chip.errors import BusError

# ANenergy counts accepted without a negative Pmean (a direction change inside one interval)
REVERSE_SLACK_COUNTS = 2
# windows whose counts wait for a first trusted power to tell their direction
UNDIRECTED_MAX_WINDOWS = 10
# ATenergy reads after a word outside what the power allows (each may go astray on its own)
REREADS = 2


class EnergyAccount:
    """The cumulative energy of one chip and the checks each window's counts pass."""

    def __init__(self, chip):
        self.chip = chip  # the Protocol reading this chip (module docstring)
        self.counts = 0  # type: int  # cumulative forward counts: ATenergy less ANenergy
        self.reverse_counts = 0  # type: int  # cumulative ANenergy counts (reverse active)
        self.reverse_carry = 0  # type: int  # ANenergy read ahead of ATenergy (read later)
        self.reversing = False  # type: bool  # inside a reverse-energy episode
        self.reverse_episode = 0  # type: int  # reverse counts since the episode began
        self.undirected = 0  # type: int  # counts metered before any trusted power
        self.undirected_windows = 0  # type: int  # windows held so (at most the limit)
        self.t_energy = None  # type: int | None  # when the last ATenergy read was
        self.last_power = None  # type: float | None  # W of the last accepted reading
        # intervals the chip could not meter: (t_from, t_to, reason, estimate_j or None)
        self.unmetered = []  # type: list[tuple[int, int, str, float | None]]

    def event(self, kind, detail):
        self.chip.event(kind, detail)

    def seconds(self, ticks):
        # type: (int) -> float
        return self.chip.seconds(ticks)

    def restart(self):
        # type: () -> None
        """Clear what the chip metered during its start-up sequence; metering counts from now.

        A discarding read a bit error sent elsewhere clears nothing: the next reading would
        count the interval just declared unmetered. Read again: a cleared register holds what
        the few ms since can meter (kept); more, and the first read did not clear (this read's
        counts are the discarded ones: metering restarts from it)."""
        chip = self.chip
        chip.read_clear(regs.AT_ENERGY)
        self.t_energy = chip.t_read_clear
        again = chip.read_clear(regs.AT_ENERGY)
        dt_s = self.seconds(chip.t_read_clear - self.t_energy)
        j_per_count = chip.calibration.joules_per_count()
        if self.last_power is None:
            residue = plausibility.physical_bound_counts(dt_s, j_per_count, chip.limits)
        else:
            residue = energy_window.counts_range(self.last_power, self.last_power, dt_s,
                                                 j_per_count, self.pmean_step_w())[1]
        if again <= residue:
            self.counts += again
        self.t_energy = chip.t_read_clear
        self.reverse_carry = 0

    def keep_before_fault(self, counts, t):
        # type: (int, int) -> None
        """The ATenergy word of a reading that found the chip out of its set state (a
        re-start follows): counted, and the interval closed at `t`, only when the power before
        supports it (a word redirected to ATenergy recovered); else nothing is counted and the
        re-start declares the interval from the last good read unmetered."""
        if self.t_energy is None:
            return
        j_per_count = self.chip.calibration.joules_per_count()
        dt_s = self.seconds(t - self.t_energy)
        if self.last_power is None:
            keep = counts <= plausibility.physical_bound_counts(dt_s, j_per_count,
                                                                self.chip.limits)
        else:
            counts = self._recovered_counts(counts, dt_s, self.last_power, j_per_count)
            lo, hi = energy_window.counts_range(self.last_power, self.last_power, dt_s,
                                                j_per_count, self.pmean_step_w())
            keep = lo <= counts <= hi
        if keep:  # metering ran until now: keep what it counted
            self.counts += counts
            self.t_energy = t

    def add_window(self, counts, t, power_w, apparent_va):
        # type: (int, int, float | None, float | None) -> None
        """Count one window's ATenergy word (read at `t`; `power_w`/`apparent_va`: this
        reading's trusted Pmean/Smean, None when it has none): checked, unwrapped, less its
        reverse part."""
        counts = self.checked_energy(counts, t, power_w, apparent_va)
        counts = self.unwrap(counts, t, power_w)
        self.counts += self.split_reverse(counts, t, power_w)
        self.t_energy = t
        if power_w is not None:
            self.last_power = power_w

    def note_unmetered(self, t_from, t_to, reason):
        # type: (int | None, int | None, str) -> str
        if t_from is None or t_to is None or t_to <= t_from:
            return "no metered interval lost"
        dt_s = self.seconds(t_to - t_from)
        p = self.last_power
        est = None if p is None else abs(p) * dt_s
        self.unmetered.append((t_from, t_to, reason, est))
        est_text = "unknown" if est is None else "≈%.3f J at the last power" % est
        return "energy over %.3f s not metered (%s), excluded from energy_j" % (dt_s, est_text)

    def checked_energy(self, counts, t, power_w, apparent_va):
        """ATenergy counts checked against the power over the interval since the last read.

        A word read and a LastData that disagreed (`read_clear_other`): the one the power
        supports is taken. Counts above what the power allows (with no trusted power: what any
        load in the channel's ranges allows) are re-read at once. A redirected read (a MOSI bit
        error sent it to another register) did not clear ATenergy, so the re-read finds the
        interval's counts still there: those are taken (`misread`). A genuine read found next
        to nothing left: the first word is not believable and is discarded, at the cost of at
        most that interval's energy (`implausible`).
        """
        if self.t_energy is None:
            return counts
        j_per_count = self.chip.calibration.joules_per_count()
        dt_s = self.seconds(t - self.t_energy)
        if power_w is None:
            bound = plausibility.physical_bound_counts(dt_s, j_per_count, self.chip.limits)
        else:
            powers = [power_w, apparent_va or 0.0]
            if self.last_power is not None:
                powers.append(self.last_power)
            bound = plausibility.energy_bound_counts(powers, dt_s, j_per_count, self.chip.limits)
        other = self.chip.read_clear_other
        doubtful = other is not None and other != counts
        trusted = power_w if power_w is not None else self.last_power
        if doubtful and trusted is not None:
            # the word, the LastData words seen before LastData settled (a redirected LastData
            # read overwrites it) and the settled one: the one the power supports is taken
            expected = self._expected_counts(trusted, dt_s, j_per_count)
            best = counts
            candidates = list(self.chip.read_clear_seen)
            candidates.append(other)
            for w in candidates:
                if abs(w - expected) < abs(best - expected):
                    best = w
            if best != counts:
                self.event("misread", "ATenergy read %d but LastData then held %d; %d expected "
                           "from the power: %d counted" % (other, counts, int(expected), best))
                counts, other = best, None
        if counts <= bound:
            if power_w is None and self.last_power is None:
                if doubtful:
                    # no power yet to tell the word from LastData's: neither is counted, the
                    # interval is declared unmetered
                    return self._declare_unknown(counts, other, t)
                return counts
            before = self.last_power if self.last_power is not None else power_w
            after = power_w if power_w is not None else before  # no trusted power now
            counts = self._recovered_counts(counts, dt_s, after, j_per_count)
            lo, hi = energy_window.counts_range(before, after, dt_s, j_per_count,
                                                self.pmean_step_w())
            if lo <= counts <= hi and counts not in self.chip.known_words:
                return counts
            power_w = after
            expected = self._expected_counts(power_w, dt_s, j_per_count)
            return self._reread_energy(counts, t, expected, power_w, apparent_va, j_per_count,
                                       doubtful, lo, hi)
        self.chip.stats["energy_misreads"] += 1
        again = self.chip.read_clear(regs.AT_ENERGY)
        residue = plausibility.energy_bound_counts(
            [power_w or 0.0, apparent_va or 0.0], self.seconds(self.chip.t_read_clear - t),
            j_per_count, self.chip.limits)
        first = "ATenergy read %d counts (%.3f J) in %.3f s where the power allows %d" % (
            counts, counts * j_per_count, dt_s, int(bound))
        if again > residue:
            self.event("misread", "%s; the register still held %d counts, so the first read "
                       "did not reach ATenergy: discarded, %d counted" % (first, again, again))
            # another read of this reading may have been sent to ATenergy and cleared it first
            trusted = power_w if power_w is not None else self.last_power
            return self._recovered_counts(again, dt_s, trusted, j_per_count)
        if other is not None and other <= bound:
            self.event("misread", "%s; the register read %d but LastData then said %d (a "
                       "redirected LastData read overwrites it): %d counted"
                       % (first, other, counts, other))
            return other + again
        note = self.note_unmetered(self.t_energy, t, "ATenergy word not believable")
        self.event("implausible", "%s; a re-read found %d counts: the register was read, but "
                   "the word is not believable (a load that rose that fast would show in the "
                   "power registers): discarded, %d counted; %s" % (first, again, again, note))
        return again

    def _declare_unknown(self, counts, other, t):
        """A read-clear word the access could not settle (the word read and LastData
        disagreed, and no power supports either): the interval since the last read is declared
        unmetered; nothing of it is counted."""
        note = self.note_unmetered(self.t_energy, t, "ATenergy word not recoverable")
        self.event("implausible", "ATenergy read %s but LastData then held %d, and the power "
                   "supports neither: discarded; %s"
                   % ("-" if other is None else "%d" % other, counts, note))
        return 0

    def _reread_energy(self, counts, t, expected, power_w, apparent_va, j_per_count,
                       doubtful=False, lo=None, hi=None):
        """Counts within the bounds but outside what the Pmean before and after the window
        allow (`energy_window`), or equal to another register's word: read ATenergy again.
        Finding the interval's counts still there, the first read went to another register
        (discarded). Finding next to nothing, the register was read: a load that changed
        within the window (the Pmean registers refresh once a measurement cycle, so a drop
        may not show yet): both reads counted, never refused."""
        self.chip.stats["energy_rereads"] += 1
        before = self.last_power if self.last_power is not None else power_w
        again = counts
        for attempt in range(REREADS):
            try:
                again = self.chip.read_clear(regs.AT_ENERGY)
            except BusError:
                return counts  # the re-read itself failed: the first word stands
            again = self._settled_reread(again, before, power_w, j_per_count)
            residue = plausibility.energy_bound_counts(
                [power_w, apparent_va or 0.0], self.seconds(self.chip.t_read_clear - t),
                j_per_count, self.chip.limits)
            if again <= residue:
                return self._reread_found_nothing(counts, again, t, expected, doubtful, lo, hi)
            self.chip.stats["energy_misreads"] += 1
            dt_now_s = self.seconds(self.chip.t_read_clear - self.t_energy)
            lo_now, hi_now = energy_window.counts_range(before, power_w, dt_now_s, j_per_count,
                                                        self.pmean_step_w())
            if (lo_now <= again <= hi_now and again not in self.chip.known_words) \
                    or attempt == REREADS - 1:
                break
            # the re-read's word is outside what the power allows as well: it may have gone to
            # another register too (the counts are still there), or cleared them and come back
            # garbled (then they are unknown): read once more
            self.event("misread", "ATenergy read %d, then %d, where the power says %d: "
                       "read once more" % (counts, again, int(expected)))
            counts = again
            doubtful = True
        self.event("misread", "ATenergy read %d counts where the power says %d; the register "
                   "still held %d, so the first read did not reach ATenergy: discarded, %d "
                   "counted" % (counts, int(expected), again, again))
        # another read of this reading may have been sent to ATenergy and cleared it first
        return self._recovered_counts(again, self.seconds(t - self.t_energy), power_w,
                                      j_per_count)

    def _settled_reread(self, again, before, power_w, j_per_count):
        """A re-read whose word and LastData disagreed (`read_clear_other`): the word of it
        that the power over the whole window allows, when the settled one is not (the first
        read went elsewhere and a redirected LastData read then overwrote this one's word)."""
        chip = self.chip
        if chip.read_clear_other is None:
            return again
        dt_s = self.seconds(chip.t_read_clear - self.t_energy)
        lo, hi = energy_window.counts_range(before, power_w, dt_s, j_per_count,
                                            self.pmean_step_w())
        if lo <= again <= hi:
            return again
        candidates = list(chip.read_clear_seen)
        candidates.append(chip.read_clear_other)
        for w in candidates:
            if lo <= w <= hi:
                self.event("misread", "ATenergy re-read %d but LastData then held %d: %d, "
                           "within what the power allows, taken"
                           % (chip.read_clear_other, again, w))
                return w
        return again

    def _reread_found_nothing(self, counts, again, t, expected, doubtful, lo, hi):
        """A re-read found next to nothing (`again`): the read of `counts` reached ATenergy."""
        flipped = self._one_bit_from(counts, lo, hi)
        if flipped is not None:
            # the word and LastData both carried the same flipped bit (LastData then agrees
            # with the word): the only word one bit away that the power allows is counted
            self.event("misread", "ATenergy read %d counts where the power says %d; the "
                       "register was read (a re-read found %d); %d is one bit from it and "
                       "within what the power allows: %d counted"
                       % (counts, int(expected), again, flipped, flipped))
            return flipped + again
        if doubtful:
            # the register was read, but its word and LastData disagreed (or the word came
            # after another misread) and the power supports neither: the interval's counts
            # are unknown (declared), the few counts since are kept
            self._declare_unknown(counts, None, t)
            return again
        return counts + again

    def _one_bit_from(self, counts, lo, hi):
        """The one word a single bit away from `counts` within [lo, hi] (None: no range, none,
        more than one, or no bit error seen in this reading: on a clean bus a word outside the
        range is a load that changed within the window, counted as read)."""
        chip = self.chip
        if not (chip.disagreements or chip.rejected or chip.unconfirmed):
            return None
        if lo is None or hi is None or lo <= counts <= hi:
            return None
        found = None
        for bit in range(16):
            w = counts ^ (1 << bit)
            if lo <= w <= hi:
                if found is not None:
                    return None
                found = w
        return found

    def pmean_step_w(self):
        # type: () -> float
        """Half the Pmean register step as read (0 when read with its LSB extension)."""
        return self.chip.quanta.get("Pmean", 0.0) if self.chip.quanta else 0.0

    def _expected_counts(self, power_w, dt_s, j_per_count):
        last = self.last_power if self.last_power is not None else power_w
        return (abs(power_w) + abs(last)) / 2 * dt_s / j_per_count

    def _recovered_counts(self, counts, dt_s, power_w, j_per_count):
        """A read that a MOSI bit error redirected to ATenergy (FuncEn 02H and Pmean 4AH are
        one bit away from 42H) cleared it and returned the counts as a misread word: when the
        counts fall short of the power by about such a word, that word is the missing energy."""
        if power_w is None or not (self.chip.rejected or self.chip.unconfirmed):
            return counts
        expected = self._expected_counts(power_w, dt_s, j_per_count)
        if expected < 20 or counts >= expected / 2:
            return counts
        for w in self.chip.rejected + self.chip.unconfirmed:
            if abs(counts + w - expected) <= expected / 4:
                self.event("misread", "ATenergy read %d counts where the power says %d; a "
                           "misread word of this reading was %d (a read redirected to "
                           "ATenergy clears it): counted" % (counts, int(expected), w))
                return counts + w
        return counts

    def split_reverse(self, counts, t, power_w):
        # type: (int, int, float | None) -> int
        """The forward part of `counts` (absolute, ATenergy read at `t`): ANenergy, read now,
        is the reverse part, kept in `reverse_counts`. ANenergy read a moment after ATenergy
        may hold a few counts ATenergy shows next time: carried over, so totals stay exact.

        ANenergy is read only when Pmean was negative in this reading or the last (or counts
        are carried over): a forward-only channel reads exactly what it read before. Reverse
        flow that never turns a reading's Pmean negative stays in ANenergy until one does, and
        is then bounded below. A word above the absolute counts plus what the power allows
        since is a misread (ignored: the sign of Pmean decides); so is a failed read."""
        j_per_count = self.chip.calibration.joules_per_count()
        negative = power_w is not None and power_w < 0
        if (power_w is None and self.last_power is None
                and self.undirected_windows < UNDIRECTED_MAX_WINDOWS):
            # direction unknown (no trusted power now nor before: the first windows after
            # start while the chip is not ready): held, not counted either way, until a
            # trusted power says which way (ANenergy keeps accumulating meanwhile, so the
            # split below then covers these windows too; no extra bus traffic). A channel
            # whose power is never trusted gets its counts back as before, a few windows late.
            self.undirected += counts
            self.undirected_windows += 1
            return 0
        counts += self.undirected
        self.undirected = 0
        may_reverse = negative or (self.last_power is not None and self.last_power < 0)
        if not may_reverse and not self.reverse_carry:
            # forward power now and before: ANenergy is not read (the bus traffic of a
            # forward-only channel stays as it was); what it holds waits for a negative Pmean
            return counts
        try:
            reverse = self.chip.read_clear(regs.AN_ENERGY)
        except BusError:
            reverse = counts if negative else 0
        else:
            room = plausibility.physical_bound_counts(self.seconds(self.chip.t_read_clear - t),
                                                      j_per_count, self.chip.limits)
            if reverse > counts + room:
                self.chip.stats["energy_misreads"] += 1
                self.event("misread", "ANenergy read %d counts (absolute %d, Pmean %s): not "
                           "the reverse register's word; %s" % (
                               reverse, counts, "-" if power_w is None else "%.3f" % power_w,
                               "all reverse" if negative else "none counted as reverse"))
                reverse = counts if negative else 0
        reverse += self.reverse_carry
        used = reverse if reverse < counts else counts
        self.reverse_carry = reverse - used
        self.reverse_counts += used
        self.reverse_episode += used
        if self.reverse_episode > REVERSE_SLACK_COUNTS and not self.reversing:
            # the episode's counts, not one window's: at 20 Hz on a coarse meter constant a
            # window holds fewer counts than the slack, and the event never came
            self.reversing = True
            seen = self.reverse_episode
            self.event("reverse_energy", "%d counts (%.3f J) of REVERSE active energy "
                       "(ANenergy): the CT is clamped the wrong way round, or this node exports "
                       "energy. Not counted as consumption. Fix: turn the clamp round (its arrow "
                       "pointing at the load) and restart the run" % (seen, seen * j_per_count))
        elif not used and not negative:
            self.reversing = False
            self.reverse_episode = 0
        return counts - used

    def unwrap(self, counts, t, power_w):
        """Add whole register wraps that a long gap between reads can hide."""
        if self.t_energy is None or power_w is None:
            return counts
        dt_s = self.seconds(t - self.t_energy)
        expected = self._expected_counts(power_w, dt_s, self.chip.calibration.joules_per_count())
        if not expected < 1e300 or expected < regs.ENERGY_WRAP / 2:  # not finite, or no wrap
            return counts
        wraps = round((expected - counts) / regs.ENERGY_WRAP)
        if wraps <= 0:
            return counts
        self.chip.stats["wrap_corrections"] += 1
        fixed = counts + wraps * regs.ENERGY_WRAP
        self.event("late", "%.1f s between energy reads: the register wrapped %d× (read %d, "
                   "≈%d counts expected from the mean power); counted %d"
                   % (dt_s, wraps, counts, int(expected), fixed))
        return fixed
