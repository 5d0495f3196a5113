"""Point labels that never overlap: each label is tried at growing offsets in eight directions
around its point and kept at the first place where its box (in the figure's own layout, from
the renderer) meets no other label, no obstacle text and stays inside the axes when it can.

Call it after the axes' limits and the figure's layout are final (after tight_layout): the
offsets are in points, so a later change of the axes' size could bring labels together.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.backend_bases import RendererBase
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure, SubFigure
from matplotlib.text import Annotation, Text
from matplotlib.transforms import Bbox

# (dx, dy) unit directions, right/up first: the usual reading place of a point label.
_DIRECTIONS = ((1, 1), (1, -1), (-1, 1), (-1, -1), (1, 0), (0, 1), (-1, 0), (0, -1))
_RADII_PT = (5, 10, 16, 24, 34, 46, 60, 80, 105, 135, 170)
PAD_PX = 1.0


@dataclass(frozen=True)
class PointLabel:
    x: float
    y: float
    text: str
    fontsize: float = 8
    color: str = "black"


def _renderer(fig: Figure | SubFigure) -> RendererBase:
    """The figure's renderer: the report draws with Agg (boxes are measured in its layout)."""
    canvas = fig.canvas
    if not isinstance(canvas, FigureCanvasAgg):
        raise TypeError(f"label placement needs an Agg canvas, not {type(canvas).__name__}")
    return canvas.get_renderer()


def _grown(b: Bbox, pad: float) -> Bbox:
    return Bbox.from_extents(b.x0 - pad, b.y0 - pad, b.x1 + pad, b.y1 + pad)


def _overlaps(b: Bbox, others: Sequence[Bbox]) -> bool:
    g = _grown(b, PAD_PX)
    return any(g.overlaps(o) for o in others)


def place_labels(ax: Axes, labels: Sequence[PointLabel],
                 obstacles: Sequence[Artist] = ()) -> list[Annotation]:
    """Annotate each point with its label where it overlaps nothing already placed."""
    fig = ax.figure
    fig.canvas.draw()
    renderer = _renderer(fig)
    axes_box = ax.get_window_extent(renderer)
    taken = [t.get_window_extent(renderer) for t in obstacles
             if not isinstance(t, Text) or _drawn(ax, t)]
    out: list[Annotation] = []
    for lab in labels:
        if not axes_box.contains(*ax.transData.transform((lab.x, lab.y))):
            continue  # outside the view: matplotlib would not draw its label
        chosen: Annotation | None = None
        fallback: tuple[Annotation, Bbox] | None = None
        for r in _RADII_PT:
            for dx, dy in _DIRECTIONS:
                ann = ax.annotate(
                    lab.text, (lab.x, lab.y), textcoords="offset points",
                    xytext=(dx * r, dy * r), fontsize=lab.fontsize, color=lab.color,
                    ha="left" if dx > 0 else "right" if dx < 0 else "center",
                    va="bottom" if dy > 0 else "top" if dy < 0 else "center",
                    arrowprops={"arrowstyle": "-", "color": "#999999", "lw": 0.5}
                    if r >= 16 else None)
                box = ann.get_window_extent(renderer)
                if not _overlaps(box, taken):
                    inside = axes_box.containsx(box.x0) and axes_box.containsx(box.x1) and \
                        axes_box.containsy(box.y0) and axes_box.containsy(box.y1)
                    if inside:
                        chosen = ann
                        taken.append(box)
                        break
                    if fallback is None:
                        fallback = (ann, box)
                        continue
                ann.remove()
            if chosen is not None:
                break
        if chosen is None and fallback is not None:  # free, but outside the axes
            chosen = fallback[0]
            taken.append(fallback[1])
        elif fallback is not None:
            fallback[0].remove()
        if chosen is None:  # nowhere free within reach: far out, to the right, stacked
            chosen = ax.annotate(lab.text, (lab.x, lab.y), textcoords="offset points",
                                 xytext=(_RADII_PT[-1], 0), fontsize=lab.fontsize,
                                 color=lab.color)
            box = chosen.get_window_extent(renderer)
            step = box.height + 2 * PAD_PX + 1
            k = 0
            while _overlaps(box, taken) and k < 200:
                k += 1
                chosen.set_position((_RADII_PT[-1], -k * step * 72 / fig.dpi))
                box = chosen.get_window_extent(renderer)
            taken.append(box)
        out.append(chosen)
    return out


def _drawn(ax: Axes, t: Text) -> bool:
    """False for an empty or hidden text, and for an annotation whose point lies outside the
    axes (matplotlib does not draw those)."""
    if not t.get_text() or not t.get_visible():
        return False
    if isinstance(t, Annotation) and t.xycoords == "data":
        x, y = ax.transData.transform(t.xy)
        return bool(ax.bbox.contains(x, y))
    return True


def label_boxes(ax: Axes) -> list[tuple[str, Bbox]]:
    """(text, box in display pixels) of every text drawn in the axes, for overlap tests."""
    renderer = _renderer(ax.figure)
    return [(t.get_text(), t.get_window_extent(renderer)) for t in ax.texts if _drawn(ax, t)]


def overlapping(ax: Axes) -> list[tuple[str, str]]:
    """Pairs of texts in the axes whose boxes intersect ([] when none do)."""
    boxes = label_boxes(ax)
    return [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:]
            if ba.overlaps(bb)]
