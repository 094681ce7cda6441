"""Each queue's last hour as a small SVG chart, drawn on the server (no JavaScript): its depth,
the runs that ended and failed per minute, and the buckets it was paused or shed in.

The chart carries its series as data attributes too (``data-depth``, ``data-processed``,
``data-failed``, comma-separated, empty where nothing was recorded), so a test or a curious
operator reads the numbers behind the lines.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from composition.queues.history import Bucket

__all__ = ["latest", "queue_chart"]

WIDTH, HEIGHT, PAD = 300, 64, 2


def _series(values: Sequence[float | None], top: float, step: float) -> str:
    """SVG polyline points for ``values`` scaled to ``top``; a gap (None) is left out."""
    points = []
    for index, value in enumerate(values):
        if value is None:
            continue
        y = HEIGHT - PAD - (value / top if top else 0.0) * (HEIGHT - 2 * PAD)
        points.append(f"{index * step + step / 2:.1f},{y:.1f}")
    return " ".join(points)


def _data(values: Sequence[float | None]) -> str:
    return ",".join("" if value is None else f"{value:g}" for value in values)


def queue_chart(queue: str, buckets: Sequence[Bucket | None]) -> SafeString:
    """The chart of one queue's ``buckets`` (oldest first)."""
    step = WIDTH / max(1, len(buckets))
    depth = [None if bucket is None or bucket.depth is None else float(bucket.depth) for bucket in buckets]
    processed = [None if bucket is None else bucket.processed_per_min for bucket in buckets]
    failed = [None if bucket is None else bucket.failed_per_min for bucket in buckets]
    depth_top = max((value for value in depth if value is not None), default=0.0)
    rate_top = max((value for value in processed + failed if value is not None), default=0.0)
    marks = format_html_join(
        "", '<rect class="pause-mark{}" x="{}" y="0" width="{}" height="{}"><title>{}</title></rect>',
        ((" shed" if bucket.shed else "", f"{index * step:.1f}", f"{step:.1f}", HEIGHT,
          ("shed" if bucket.shed else "paused") + f" at {bucket.started_at:%H:%M:%S}")
         for index, bucket in enumerate(buckets) if bucket is not None and (bucket.paused or bucket.shed)))
    lines = mark_safe("".join(
        str(format_html('<polyline class="{}" points="{}"/>', name, _series(values, top, step)))
        for name, values, top in (("processed", processed, rate_top), ("failed", failed, rate_top),
                                  ("depth", depth, depth_top))))
    return format_html(
        '<svg class="ops-chart" data-queue="{}" data-depth="{}" data-processed="{}" data-failed="{}" '
        'width="{}" height="{}" viewBox="0 0 {} {}" role="img" aria-label="{}">{}{}</svg>',
        queue, _data(depth), _data(processed), _data(failed), WIDTH, HEIGHT, WIDTH, HEIGHT,
        f"{queue}: depth up to {depth_top:g}, up to {rate_top:g} runs per minute", marks, lines)


def latest(buckets: Sequence[Bucket | None]) -> str:
    """The last bucket in words, for the chart's caption: depth, runs per minute, paused or shed."""
    last = next((bucket for bucket in reversed(buckets) if bucket is not None), None)
    if last is None:
        return "no history yet"
    depth = "?" if last.depth is None else f"{last.depth:,}"
    state = " · shed" if last.shed else " · paused" if last.paused else ""
    return f"depth {depth} · {last.processed_per_min:,.0f}/min · {last.failed_per_min:,.0f} failed/min{state}"
