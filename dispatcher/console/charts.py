"""The console's history charts, drawn on the server as SVG (no script, no CDN: the page's
Content-Security-Policy stays strict, and a page without JavaScript has its charts).

Two charts per range, from GET /v1/history's points (dispatcher.operator.history): jobs per step
(started, succeeded, retried, dead) on a linear axis, and the due-to-start latency (p50, p95) on
a logarithmic one (the percentiles are histogram bucket bounds from 1 ms to an hour). Each has
axes with tick labels, a legend, and one column per step whose `<title>` gives that step's
values on hover (and to a screen reader). Colours come from console.css, by class.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import quote

from aiohttp import web
from markupsafe import Markup, escape

from dispatcher.api.problems import Problem
from dispatcher.console.toolkit import HISTORY, PREFIX, Route, base_context, render
from dispatcher.db.history import ALL_QUEUES
from dispatcher.operator.history import (
    RANGES,
    HistoryRequestError,
    Range,
    parse_queue,
    parse_range,
    read_history,
)

WIDTH, HEIGHT = 640, 220
LEFT, RIGHT, TOP, BOTTOM = 52, 10, 28, 24  # the plot area's margins (axis labels, legend)
COUNT_SERIES = (
    ("started", "started"),
    ("succeeded", "succeeded"),
    ("retried", "retried"),
    ("dead", "dead"),
)
LATENCY_SERIES = (("p50_ms", "p50"), ("p95_ms", "p95"))
DOTS_UP_TO = 15  # points per chart
# x tick labels: every this many steps, and how a tick's time reads (UTC)
X_TICKS = {"15m": (3, "%H:%M"), "24h": (16, "%H:%M"), "7d": (12, "%a %d")}


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 5 x 10^k at least `value` (1 for nothing)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for factor in (1, 2, 5, 10):
        if factor * power >= value:
            return float(factor * power)
    return float(10 * power)


def count_label(value: float) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    if value >= 1000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def ms_label(ms: float) -> str:
    return f"{ms / 1000:g} s" if ms >= 1000 else f"{ms:g} ms"


def parse_at(point: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(str(point["at"]).replace("Z", "+00:00"))


class Plot:
    """The plot area of one chart: x by step index, y by a scale function onto [0, 1]."""

    def __init__(self, steps: int, scale: Callable[[float], float]):
        self.steps = max(steps, 1)
        self.scale = scale
        self.width = WIDTH - LEFT - RIGHT
        self.height = HEIGHT - TOP - BOTTOM

    def x(self, index: float) -> float:
        """The centre of step `index`."""
        return LEFT + self.width * (index + 0.5) / self.steps

    def y(self, value: float) -> float:
        return TOP + self.height * (1 - min(max(self.scale(value), 0.0), 1.0))


def _frame(
    plot: Plot, y_ticks: Sequence[tuple[float, str]], points: list[dict[str, Any]], r: Range
) -> list[str]:
    """Axes, grid lines, y tick labels and x tick labels (UTC)."""
    parts = ['<g class="axis">']
    for value, label in y_ticks:
        y = plot.y(value)
        parts.append(
            f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="tick" x="{LEFT - 4}" y="{y + 3:.1f}" text-anchor="end">'
            f"{escape(label)}</text>"
        )
    bottom = HEIGHT - BOTTOM
    parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{bottom}" y2="{bottom}"/>')
    parts.append(f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{bottom}"/>')
    every, form = X_TICKS.get(r.name, (max(1, len(points) // 5), "%H:%M"))
    for i, p in enumerate(points):
        if (len(points) - 1 - i) % every:
            continue  # ticks counted back from the newest step: "now" is always labelled
        x = plot.x(i) - plot.width / plot.steps / 2  # a step's start
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{bottom}" y2="{bottom + 4}"/>'
            f'<text class="tick" x="{x:.1f}" y="{bottom + 15}" text-anchor="middle">'
            f"{escape(parse_at(p).strftime(form))}</text>"
        )
    parts.append("</g>")
    return parts


def _legend(series: Sequence[tuple[str, str]], prefix: str) -> list[str]:
    parts = ['<g class="legend">']
    x = LEFT
    for _, name in series:
        parts.append(
            f'<rect class="swatch {prefix}-{name}" x="{x}" y="8" width="10" height="10"/>'
            f'<text x="{x + 14}" y="17">{escape(name)}</text>'
        )
        x += 24 + 8 * len(name)
    parts.append("</g>")
    return parts


def _lines(
    plot: Plot, points: list[dict[str, Any]], series: Sequence[tuple[str, str]], prefix: str
) -> list[str]:
    parts = []
    for field, name in series:
        coords = [
            f"{plot.x(i):.1f},{plot.y(float(p[field])):.1f}"
            for i, p in enumerate(points)
            if p.get(field) is not None
        ]
        if coords:
            parts.append(f'<polyline class="series {prefix}-{name}" points="{" ".join(coords)}"/>')
        # dots on the points with a value where there are few (15 minutes), or where a series
        # has one point (a line needs two); on 96 points they would only weigh (~40 KB)
        if len(points) <= DOTS_UP_TO or len(coords) == 1:
            parts.extend(
                f'<circle class="dot {prefix}-{name}" cx="{plot.x(i):.1f}" '
                f'cy="{plot.y(float(p[field])):.1f}" r="2.5"/>'
                for i, p in enumerate(points)
                if p.get(field)
            )
    return parts


def _hover(
    plot: Plot, points: list[dict[str, Any]], r: Range, describe: Callable[[dict[str, Any]], str]
) -> list[str]:
    """One transparent column per step, titled with the step's values."""
    width = plot.width / plot.steps
    form = "%Y-%m-%d %H:%M" if r.step_s < 86400 else "%Y-%m-%d"
    parts = ['<g class="hover">']
    for i, p in enumerate(points):
        title = f"{parse_at(p).strftime(form)}Z (+{r.step_s // 60} min): {describe(p)}"
        parts.append(
            f'<rect x="{plot.x(i) - width / 2:.1f}" y="{TOP}" width="{width:.1f}" '
            f'height="{plot.height}"><title>{escape(title)}</title></rect>'
        )
    parts.append("</g>")
    return parts


def _svg(kind: str, label: str, parts: list[str]) -> Markup:
    return Markup(
        f'<svg class="chart history-chart" data-chart="{kind}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'role="img" aria-label="{escape(label)}">' + "".join(parts) + "</svg>"
    )


def counts_chart(points: list[dict[str, Any]], r: Range) -> Markup:
    """Started, succeeded, retried and dead per step, on a linear axis from zero."""
    largest = max((p[f] for p in points for f, _ in COUNT_SERIES), default=0)
    step = max(nice_ceiling(largest / 4), 1.0)  # whole counts: at most 4 steps of 1, 2, 5 x 10^k
    top = step * max(math.ceil(largest / step), 1)
    plot = Plot(len(points), lambda v: v / top)
    ticks = [(step * k, count_label(step * k)) for k in range(round(top / step) + 1)]

    def describe(p: dict[str, Any]) -> str:
        counts = ", ".join(f"{name} {p[f]}" for f, name in COUNT_SERIES)
        age = p.get("oldest_ready_s")
        return counts if age is None else f"{counts}; oldest ready {age:g} s"

    parts = [
        *_frame(plot, ticks, points, r),
        *_legend(COUNT_SERIES, "c"),
        *_lines(plot, points, COUNT_SERIES, "c"),
        *_hover(plot, points, r, describe),
    ]
    return _svg("counts", f"Jobs per {r.step_s // 60} minutes over {r.label}", parts)


def latency_chart(points: list[dict[str, Any]], r: Range) -> Markup:
    """The due-to-start latency's p50 and p95 per step, on a log axis of whole decades."""
    values = [p[f] for p in points for f, _ in LATENCY_SERIES if p.get(f)]
    low = 10 ** math.floor(math.log10(min(values))) if values else 1.0
    high = 10 ** math.ceil(math.log10(max(values))) if values else 1000.0
    if high <= low:
        high = low * 10
    span = math.log10(high) - math.log10(low)
    plot = Plot(len(points), lambda v: (math.log10(max(v, low)) - math.log10(low)) / span)
    ticks = [(low * 10**k, ms_label(low * 10**k)) for k in range(round(span) + 1)]

    def describe(p: dict[str, Any]) -> str:
        if p.get("p50_ms") is None:
            return "nothing started"
        return f"p50 ≤ {ms_label(p['p50_ms'])}, p95 ≤ {ms_label(p['p95_ms'])}"

    parts = [
        *_frame(plot, ticks, points, r),
        *_legend(LATENCY_SERIES, "l"),
        *_lines(plot, points, LATENCY_SERIES, "l"),
        *_hover(plot, points, r, describe),
    ]
    return _svg("latency", f"Due-to-start latency p50 and p95 over {r.label}", parts)


def chart_context(history: dict[str, Any], base: str) -> dict[str, Any]:
    """What _charts.html needs: the two charts, the range links (on the page at `base`), the
    totals over the range."""
    r = RANGES[history["range"]]
    points = history["points"]
    return {
        "range": r,
        "ranges": list(RANGES.values()),
        "counts": counts_chart(points, r),
        "latency": latency_chart(points, r),
        "base": base,
        "queue": history["queue"],
        "totals": {f: sum(p[f] for p in points) for f, _ in COUNT_SERIES},
    }


# the console's side --------------------------------------------------------------------------
async def history_charts(request: web.Request, queue: str) -> dict[str, Any]:
    """The charts of `queue` ('*': all) for the range the page's `range` parameter names."""
    try:
        r = parse_range(request.query.get("range"))
    except HistoryRequestError as exc:
        raise Problem(400, str(exc)) from None
    history = await read_history(request.app[HISTORY], queue, r)
    base = f"{PREFIX}/" if queue == ALL_QUEUES else f"{PREFIX}/queues/{quote(queue, safe='')}"
    return chart_context(history, base)


async def charts_fragment(request: web.Request) -> web.StreamResponse:
    """The charts alone (console.js fetches them again every 10 s while the page is visible)."""
    try:
        queue = parse_queue(request.query.get("queue"))
    except HistoryRequestError as exc:
        raise Problem(400, str(exc)) from None
    context = base_context(request, "History", "overview")
    context["charts"] = await history_charts(request, queue)
    return render(request, "_charts.html", context)


ROUTES: list[Route] = [("GET", "/charts", charts_fragment)]
