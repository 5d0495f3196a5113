"""The analysis' closed vocabularies, one home each: the words its options, tables and files use.

`epi analyze`'s click choices, the study file's `[analysis]` checks and the analysis itself all
read these, so a word is spelled once. Members are ``str`` (epi.core.vocabulary.Word): results
files keep the plain words.
"""

from __future__ import annotations

from epi.core.vocabulary import Word


class EnergyBasis(Word):
    """What a window's energy counts: the wall energy, or that less the node's idle power."""

    GROSS = "gross"
    NET = "net"


class EnergyMethod(Word):
    """Where a window's primary energy comes from."""

    COUNTER = "counter"  # the chip's energy counter (trapezoid where it does not cover a window)
    TRAPEZOID = "trapezoid"  # the integral of the power readings


class FigureMethod(Word):
    """The energy method a figure over several windows used (EnergyMethod, or both mixed)."""

    COUNTER = "counter"
    TRAPEZOID = "trapezoid"
    MIXED = "mixed"


class EdgeModel(Word):
    """How a window's edges cut the sample between two readings (docs/analysis.md)."""

    STEP = "step"
    LINEAR = "linear"


class LagMode(Word):
    """Whether the analysis shifts each channel's windows by its estimated load lag."""

    NONE = "none"
    AUTO = "auto"


class Phase(Word):
    """The phases of a request a figure is reported for."""

    PREFILL = "prefill"
    DECODE = "decode"
    REQUEST = "request"


class TokenUnit(Word):
    """The tokens a J/token figure divides by."""

    PROMPT = "prompt"
    GENERATED = "generated"
    TOTAL = "total"


# `--accuracy-metric`: this word, or a benchmark's name from the accuracy file (an open set)
COMPOSITE_METRIC = "composite"

# a results row's scope: this word for the whole meter (all channels), else a node's name
SCOPE_ALL = "all"


class WindowKind(Word):
    """The kinds of window the analysis cuts from a run: its idle stretch and each request's
    phases (a run verdict's phase is one of these too)."""

    IDLE = "idle"
    PREFILL = "prefill"
    DECODE = "decode"
    REQUEST = "request"


class ClockBasis(Word):
    """How a run's host clock maps onto the meter's (host.analysis.align.ClockMap)."""

    CLOCK_SYNC = "clock_sync"  # offsets measured by the run, drift interpolated between them
    SAME_HOST = "same_host"  # one boot, one monotonic clock: offset exactly 0
    NONE = "none"  # no usable offset: the run is flagged, not measured


class VerdictState(Word):
    """A sequential comparison's state (host.analysis.sequential): decided (a difference in one
    direction), equivalent (within the margin) or undecided (neither yet)."""

    DECIDED = "decided"
    EQUIVALENT = "equivalent"
    UNDECIDED = "undecided"


class InvalidScope(Word):
    """What an invalid stretch of a channel's trace rules out: every reading, or only the
    energy counter (power readings stay usable)."""

    ALL = "all"
    COUNTER = "counter"
