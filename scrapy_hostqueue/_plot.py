"""The host timeline chart: ``python -m scrapy_hostqueue plot FILE -o OUT.png|OUT.html``.

Draws a host timeline (``HOSTQUEUE_TIMELINE_FILE``) as stacked panels over
time: requests in flight per host, responses per second per host and, when
some downloads failed (a dead or hanging host), failures per second. PNG
needs matplotlib (``pip install 'scrapy-hostqueue[plot]'``); an ``.html`` output
is a self-contained page with inline SVG and no network loads.
"""

from __future__ import annotations

import html
import math
import os
import statistics
from typing import Any

from scrapy_hostqueue._errors import PlotError
from scrapy_hostqueue._timeline import (
    OTHER_HOSTS,
    Series,
    build_series,
    read_timeline,
)

#: Tableau 10, then grey for the aggregate.
COLORS = (
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#17becf",
)
OTHER_COLOR = "#9d9d9d"
PANELS = (("in_flight", "requests in flight"), ("rate", "responses / s"))
#: Drawn only when some download failed, so that a dead host shows.
FAILED_PANEL = ("failed", "failed downloads / s (no response)")


def _colors(names: list[str]) -> dict[str, str]:
    colors, i = {}, 0
    for name in names:
        if name == OTHER_HOSTS:
            colors[name] = OTHER_COLOR
        else:
            colors[name] = COLORS[i % len(COLORS)]
            i += 1
    return colors


def _panels(series: Series) -> tuple[tuple[str, str], ...]:
    if any(any(values) for values in series.failed.values()):
        return (*PANELS, FAILED_PANEL)
    return PANELS


def _label(name: str) -> str:
    return "other hosts" if name == OTHER_HOSTS else name


def load(path: str, max_lines: int = 10) -> Series:
    return build_series(_join_short_last_interval(read_timeline(path)), max_lines)


def _join_short_last_interval(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Join a short last interval to the one before it.

    The last interval, cut short by the spider closing, joins the one
    before it when it is shorter than half the usual interval: its responses
    are then a rate over both, so a few responses in a few milliseconds do
    not draw a spike, and every stair of the rate panel still has the
    interval's responses as its area.
    """
    times = sorted({float(row["t"]) for row in rows})
    if len(times) < 2:
        return rows
    before, last = times[-2], times[-1]
    typical = statistics.median(float(row["dt"]) for row in rows)
    if last - before >= typical / 2:
        return rows
    kept = [row for row in rows if float(row["t"]) not in (before, last)]
    # The joined interval runs from the start of the one before to the end.
    window = max(float(row["dt"]) for row in rows if float(row["t"]) == before) + last - before
    joined: dict[str, dict[str, Any]] = {}
    for row in rows:
        if float(row["t"]) == before:
            # Sampled before the end only: nothing in flight at the end.
            joined[row["host"]] = dict(row, t=last, dt=window, in_flight=0)
    for row in rows:
        if float(row["t"]) == last:
            earlier = joined.get(row["host"])
            counts = {
                name: row.get(name, 0) + (earlier.get(name, 0) if earlier is not None else 0)
                for name in ("fetched", "failed")
            }
            joined[row["host"]] = dict(row, dt=window, **counts)
    return kept + list(joined.values())


# -- PNG --------------------------------------------------------------------


def render_png(series: Series, out: str, title: str) -> None:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
        from matplotlib.figure import Figure  # noqa: PLC0415
    except ImportError:
        raise PlotError(
            "PNG output needs matplotlib: pip install 'scrapy-hostqueue[plot]' "
            "(or write an .html file)"
        ) from None
    names = list(series.in_flight)
    colors = _colors(names)
    panels = _panels(series)
    figure = Figure(figsize=(10, 3.25 * len(panels)), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(panels), 1, sharex=True)
    for ax, (attr, ylabel) in zip(axes, panels, strict=True):
        data: dict[str, list[float]] = getattr(series, attr)
        for name in names:
            if attr != "in_flight":
                # A rate holds over the interval that ends at its time: stairs.
                ax.stairs(
                    data[name],
                    [series.start, *series.times],
                    label=_label(name),
                    color=colors[name],
                    linewidth=1.4,
                    baseline=None,
                )
            else:
                ax.plot(
                    series.times, data[name], label=_label(name), color=colors[name], linewidth=1.4
                )
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.set_xlim(left=min(0.0, series.start))
        ax.grid(True, alpha=0.3)
    axes[0].set_title(title)
    axes[-1].set_xlabel("seconds since the spider opened")
    axes[0].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
    figure.savefig(out, dpi=100)


# -- HTML (inline SVG) ------------------------------------------------------

WIDTH, PANEL_HEIGHT = 900, 260
LEFT, RIGHT, TOP, BOTTOM = 60, 20, 24, 36


def _nice_step(span: float, ticks: int = 5) -> float:
    raw = span / ticks if span > 0 else 1.0
    power = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 2.5, 5, 10):
        if raw <= factor * power:
            return float(factor * power)
    return float(10 * power)  # pragma: no cover


def _fmt(value: float) -> str:
    return f"{value:g}" if abs(value) < 1e6 else f"{value:.3g}"


def _svg_panel(series: Series, attr: str, ylabel: str, colors: dict[str, str]) -> str:
    data: dict[str, list[float]] = getattr(series, attr)
    times = series.times
    x0, x1 = min(series.start, 0.0), max(times[-1], series.start + 1e-9)
    y1 = max((max(values) for values in data.values()), default=0.0) or 1.0
    xstep, ystep = _nice_step(x1 - x0), _nice_step(y1)
    y1 = math.ceil(y1 / ystep) * ystep
    plot_w, plot_h = WIDTH - LEFT - RIGHT, PANEL_HEIGHT - TOP - BOTTOM

    def sx(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * plot_w

    def sy(y: float) -> float:
        return TOP + plot_h - y / y1 * plot_h

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{PANEL_HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {PANEL_HEIGHT}" role="img" aria-label="{html.escape(ylabel)}">',
        f'<text x="{LEFT}" y="{TOP - 8}" class="ylabel">{html.escape(ylabel)}</text>',
    ]
    y = 0.0
    while y <= y1 + ystep / 2:
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" '
            'class="grid"/>'
            f'<text x="{LEFT - 6}" y="{sy(y) + 4:.1f}" class="ytick">{_fmt(y)}</text>'
        )
        y += ystep
    x = math.ceil(x0 / xstep) * xstep
    while x <= x1 + 1e-9:
        parts.append(
            f'<line x1="{sx(x):.1f}" x2="{sx(x):.1f}" y1="{TOP}" y2="{TOP + plot_h}" '
            'class="grid"/>'
            f'<text x="{sx(x):.1f}" y="{TOP + plot_h + 16}" class="xtick">{_fmt(x)}</text>'
        )
        x += xstep
    for name, values in data.items():
        points: list[str] = []
        previous = series.start
        for t, value in zip(times, values, strict=True):
            if attr != "in_flight":
                # A rate holds over the interval that ends at t: draw steps.
                points.append(f"{sx(previous):.1f},{sy(value):.1f}")
            points.append(f"{sx(t):.1f},{sy(value):.1f}")
            previous = t
        parts.append(
            f'<polyline fill="none" stroke="{colors[name]}" stroke-width="1.6" '
            f'points="{" ".join(points)}"><title>{html.escape(_label(name))}</title></polyline>'
        )
    parts.append("</svg>")
    return "\n".join(parts)


def render_html(series: Series, out: str, title: str) -> None:
    names = list(series.in_flight)
    colors = _colors(names)
    legend = "\n".join(
        f'<li><span class="swatch" style="background:{colors[name]}"></span>'
        f"{html.escape(_label(name))}</li>"
        for name in names
    )
    panels = "\n".join(_svg_panel(series, attr, label, colors) for attr, label in _panels(series))
    page = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; color: #222; }}
.wrap {{ display: flex; gap: 1.5em; align-items: flex-start; }}
svg text {{ font-size: 11px; fill: #444; }}
svg .ytick {{ text-anchor: end; }}
svg .xtick {{ text-anchor: middle; }}
svg .ylabel {{ font-size: 12px; font-weight: bold; }}
svg .grid {{ stroke: #e4e4e4; stroke-width: 1; }}
ul {{ list-style: none; padding: 0; font-size: 13px; }}
li {{ margin: 0.2em 0; white-space: nowrap; }}
.swatch {{ display: inline-block; width: 12px; height: 12px; margin-right: 6px;
  vertical-align: middle; }}
</style>
</head>
<body>
<h1 style="font-size: 1.1em">{html.escape(title)}</h1>
<div class="wrap">
<div>
{panels}
<p style="font-size: 12px; margin-left: {LEFT}px">seconds since the spider opened</p>
</div>
<ul>
{legend}
</ul>
</div>
</body>
</html>
"""
    with open(out, "w", encoding="utf-8") as f:
        f.write(page)


def plot(source: str, out: str, *, max_lines: int = 10) -> None:
    """Draw the timeline *source* into *out* (``.html``: SVG page, else PNG).

    Raises :class:`~scrapy_hostqueue._timeline.TimelineError` or :class:`PlotError`.
    """
    html = out.lower().endswith((".html", ".htm"))
    if not html and not out.lower().endswith(".png"):
        # matplotlib would pick the format from any other name, or add ".png"
        # to a name without one and write a file other than *out*.
        raise PlotError(f"the output must end in .png or .html, got {out!r}")
    series = load(source, max_lines)
    title = f"Hosts over time: {os.path.basename(source)}"
    try:
        if html:
            render_html(series, out, title)
        else:
            render_png(series, out, title)
    except OSError as error:
        raise PlotError(f"cannot write {out}: {error.strerror or error}") from None
