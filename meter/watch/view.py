"""One frame of the live view, drawn with rich: a header (daemon, modelled or measured power,
sample rate, clock offset), a table of channels (power now, a sparkline of the last seconds,
energy, samples, rate) and the latest events."""

from __future__ import annotations

import time

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from meter.watch.state import NS, ChannelView, Snapshot

BLOCKS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 24
DETAIL_CHARS = 90


def sparkline(values: list[float], width: int = SPARK_WIDTH) -> str:
    """The last `width` values as block characters scaled between their min and max (a flat
    line when they are all equal)."""
    if not values:
        return ""
    vals = values[-width:] if len(values) <= width else [
        values[int(i * len(values) / width)] for i in range(width)]
    lo, hi = min(vals), max(vals)
    if hi - lo <= 1e-12:
        return BLOCKS[0] * len(vals)
    top = len(BLOCKS) - 1
    return "".join(BLOCKS[round((v - lo) / (hi - lo) * top)] for v in vals)


def _num(x: float | None, fmt: str) -> str:
    return "—" if x is None else format(x, fmt)


def header(s: Snapshot) -> Text:
    h = s.hello
    emulated = bool(h.get("emulated"))
    period = h.get("sample_period_s")
    rates = [r for r in (c.rate_hz() for c in s.channels) if r is not None]
    text = Text()
    text.append(f"{s.url}", style="bold")
    text.append(f"  host {h.get('host', '?')}  segment {h.get('segment', '?')}  ")
    if emulated:
        text.append(f"MODELLED power (emulated: {h.get('power_model_kind') or 'model'})",
                    style="bold black on yellow")
    else:
        text.append("measured power", style="bold green")
    text.append("\nsample rate ")
    text.append(f"{sum(rates) / len(rates):.1f} Hz per channel" if rates else "—")
    if isinstance(period, int | float) and period > 0:
        text.append(f" (scheduled {1 / period:.1f} Hz)")
    text.append("   clock offset ")
    if s.offset is not None:
        text.append(f"{s.offset.offset_ns / 1e6:+.3f} ms ± {s.offset.uncertainty_ns / 1e6:.3f}"
                    " ms", style="bold")
        text.append(f" (meter − local monotonic, rtt {s.offset.rtt_ns / 1e6:.2f} ms)")
    else:
        text.append("—")
    if s.offset_error:
        text.append(f" [{s.offset_error}]", style="red")
    if s.dropped:
        text.append(f"\n{s.dropped} messages dropped by the daemon (this view fell behind)",
                    style="red")
    return text


def channel_table(channels: list[ChannelView], history_s: float) -> Table:
    table = Table(expand=False, header_style="bold")
    table.add_column("ch", justify="right")
    table.add_column("name")
    table.add_column("power W", justify="right")
    table.add_column(f"last {history_s:g} s", no_wrap=True, min_width=SPARK_WIDTH)
    for col in ("min–max W", "energy J", "samples", "rate Hz"):
        table.add_column(col, justify="right")
    for c in channels:
        hist = [p for _, p in c.history]
        table.add_row(str(c.channel), c.name, _num(c.power_w, ".3f"),
                      Text(sparkline(hist), style="cyan"),
                      f"{min(hist):.2f}–{max(hist):.2f}" if hist else "—",
                      _num(c.energy_j, ".2f"), str(c.samples), _num(c.rate_hz(), ".1f"))
    if not channels:
        table.add_row("", "waiting for samples…", "", "", "", "", "", "")
    return table


def events_panel(s: Snapshot) -> Panel:
    lines = Text()
    latest = s.last_t_mono_ns
    for e in reversed(s.events):
        age = f"{(latest - e.t_mono_ns) / NS:6.1f} s ago" if latest else ""
        where = f"ch {e.channel}" if e.channel is not None else "daemon"
        lines.append(f"{age}  {where:>7}  ", style="dim")
        lines.append(e.kind, style="bold red" if e.kind in ("fault", "gap", "chip_reset")
                     else "bold")
        detail = e.detail if len(e.detail) <= DETAIL_CHARS else e.detail[:DETAIL_CHARS] + "…"
        lines.append(f"  {detail}\n" if detail else "\n")
    if not s.events:
        lines.append("no events yet", style="dim")
    return Panel(lines, title="events", title_align="left")


def frame(s: Snapshot, history_s: float) -> RenderableType:
    parts: list[RenderableType] = [header(s), channel_table(s.channels, history_s),
                                   events_panel(s)]
    if s.ended:
        parts.append(Text(f"stream ended: {s.ended}", style="bold red"))
    parts.append(Text(time.strftime("%H:%M:%S") + "  Ctrl-C to quit", style="dim"))
    return Group(*parts)
