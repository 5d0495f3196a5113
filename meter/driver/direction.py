"""The `epi doctor`-style finding for energy that flowed the wrong way.

A channel whose chip metered reverse active energy (ANenergy; the driver keeps it apart in
`reverse_energy_j`, never in `energy_j`) has its CT clamped the wrong way round — or its node
exports energy, which a Pi never does. `direction_findings` turns each channel's forward and
reverse energy into one line with its fix, in the shape of `host.doctor.Check` (area, item,
ok, detail, fix) so the doctor can list it unchanged. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# Reverse energy below this share of the total is noise around zero load (a few counts of a
# CT offset), not a reversed clamp.
REVERSE_SHARE_THRESHOLD = 0.01
FIX = ("turn the CT clamp round so its arrow points at the load (or swap the CT's two leads), "
       "then restart the run; epi never counts reverse energy as consumption")


@dataclass(frozen=True)
class DirectionFinding:
    area: str
    item: str
    ok: bool | None
    detail: str
    fix: str = ""


def direction_findings(channels: Iterable[tuple[str, float, float]]
                       ) -> list[DirectionFinding]:
    """One finding per (name, forward_j, reverse_j): ok, reversed CT, or no energy yet."""
    out = []
    for name, forward_j, reverse_j in channels:
        total = forward_j + reverse_j
        item = f"CT orientation {name}"
        if total <= 0:
            out.append(DirectionFinding("meter", item, None, "no energy metered yet"))
        elif reverse_j / total > REVERSE_SHARE_THRESHOLD:
            out.append(DirectionFinding(
                "meter", item, False,
                f"{reverse_j:.3f} J of {total:.3f} J flowed in reverse "
                f"({reverse_j / total:.0%}): CT reversed, or the node exports", FIX))
        else:
            out.append(DirectionFinding("meter", item, True,
                                        f"{forward_j:.3f} J forward, {reverse_j:.3f} J reverse"))
    return out
