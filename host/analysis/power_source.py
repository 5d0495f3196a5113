"""Where a channel's power figures come from: measured, or modelled (and by which model).

Derived from the trace's segment metadata (formats.md §1): `emulated` and `power_model`, which
is one model for every channel or `{"kind": "per_channel", "channels": {"N": model}}`. A
software-source channel (RAPL, hwmon, NVML, PMIC: a `scope` other than `wall`, docs/sources.md)
is a measurement of a component, not of the wall — also in a trace whose wall channel is
emulated — so its label says so: "measured: component power, not wall power (rapl package)". Every
figure the analysis shows carries the label of the channels behind it, so a modelled J/token
never reads as a measurement.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Literal

from epi.formats.json_types import JSONObject
from epi.formats.trace import WALL_SCOPE
from host.analysis.traces import Trace

MEASURED: Final = "measured"
MODELLED: Final = "modelled"
# what a report's power figures rest on, as a whole: a meter, or (any part of them) a model
PowerKind = Literal["measured", "modelled"]
COMPONENT = "component power, not wall power"
MODEL_NAMES = {
    "activity": "ActivityModel: this machine's CPU activity mapped to power",
    "activity_process_tree": "ActivityModel: the inference process tree's CPU time mapped "
                             "to power",
    "activity_registered_tree": "ActivityModel: the whole machine's CPU time until a run "
                                "registered, then that run's process tree, mapped to power",
    "scripted": "scripted profile",
    "constant": "constant power",
}


def model_label(model: object) -> str:
    """'modelled (ActivityModel ...)' for a power-model description (dict with `kind`)."""
    kind = model.get("kind") if isinstance(model, dict) else None
    if kind is None:
        return "modelled (emulated chip, model not recorded)"
    name = MODEL_NAMES.get(str(kind), str(kind))
    short = {"activity": "ActivityModel", "activity_process_tree": "ActivityModel, process tree",
             "activity_registered_tree": "ActivityModel, registered run's process tree"}
    return f"modelled ({short.get(str(kind), name)})"


def _segment_channel_label(meta: JSONObject, channel: int) -> str:
    model = meta.get("power_model")
    if not meta.get("emulated") and not model:
        return MEASURED
    if isinstance(model, dict) and model.get("kind") == "per_channel":
        per = model.get("channels")
        per = per if isinstance(per, dict) else {}
        ch_model = per.get(str(channel), per.get(channel))
        if ch_model is None:
            return MEASURED if not meta.get("emulated") else model_label(None)
        return model_label(ch_model)
    return model_label(model)


def component_label(source: str | None, scope: str) -> str:
    """The label of a software-source channel: measured, but a component's power."""
    return f"{MEASURED}: {COMPONENT} ({source or 'software source'} {scope})"


def channel_sources(trace: Trace) -> dict[int, str]:
    """channel → power source over all segments ("a + b" when segments differ).

    A joined trace (several meters) labels each channel from the trace it came from."""
    if trace.origins:
        per = {id(t): channel_sources(t) for t in trace.member_traces}
        return {new: per[id(t)].get(ch, MEASURED) for new, (t, ch) in trace.origins.items()}
    out: dict[int, str] = {}
    for ch in sorted(trace.channels):
        info = trace.channels[ch]
        if info.scope != WALL_SCOPE:
            out[ch] = component_label(info.source, info.scope)
            continue
        labels = [_segment_channel_label(s.meta, ch) for s in trace.segments]
        out[ch] = " + ".join(dict.fromkeys(labels)) or MEASURED
    return out


def combined(labels: Iterable[str]) -> str:
    """One label for figures summing several channels ("measured + modelled (...)")."""
    uniq = list(dict.fromkeys(lbl for lbl in labels if lbl))
    return " + ".join(uniq) if uniq else ""


def is_modelled(label: str) -> bool:
    return "modelled" in label


def is_component(label: str) -> bool:
    return COMPONENT in label
