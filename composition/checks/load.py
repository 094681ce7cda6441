"""The checks of load control: backpressure's limits and shedding's signals and queues."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register
from django.utils.module_loading import import_string

from composition.checks.common import merged_settings, not_positive_seconds

__all__ = ["check_backpressure_settings", "check_shedding_settings"]


@register("composition")
def check_backpressure_settings(app_configs: Any = None, **_: Any) -> list[CheckMessage]:
    merged = merged_settings()
    if merged is None:
        return []
    messages = not_positive_seconds(merged, ("BACKPRESSURE_CACHE_S", "BACKPRESSURE_RETRY_AFTER_S"),
                                     "composition.E050")
    queues = merged["BACKPRESSURE_QUEUES"]
    if not isinstance(queues, dict) or any(
            not isinstance(limit, int) or isinstance(limit, bool) or limit < 1 for limit in queues.values()):
        messages.append(Error("COMPOSITION['BACKPRESSURE_QUEUES'] must map queue names to positive integers.",
                              id="composition.E051"))
    paths = merged["BACKPRESSURE_PATHS"]
    if not isinstance(paths, dict) or any(
            not str(prefix).startswith("/") or not isinstance(queue, str) for prefix, queue in paths.items()):
        messages.append(Error("COMPOSITION['BACKPRESSURE_PATHS'] must map path prefixes ('/...') to queue names.",
                              id="composition.E052"))
    elif isinstance(queues, dict):
        for prefix, queue in sorted(paths.items()):
            if queue not in queues:
                messages.append(Warning(f"BACKPRESSURE_PATHS[{prefix!r}] names queue {queue!r}, which has no limit "
                                        "in BACKPRESSURE_QUEUES: it is never refused.", id="composition.W050"))
    return messages + _middleware_order(paths)


BACKPRESSURE_MIDDLEWARE = "composition.backpressure.BackpressureMiddleware"


def _middleware_classes() -> list[tuple[str, type | None]]:
    """MIDDLEWARE's entries and their classes (None for one that does not import: Django's own
    loading reports it)."""
    found: list[tuple[str, type | None]] = []
    for path in getattr(settings, "MIDDLEWARE", None) or ():
        try:
            loaded = import_string(str(path))
        except ImportError:
            loaded = None
        found.append((str(path), loaded if isinstance(loaded, type) else None))
    return found


def _middleware_order(paths: Any) -> list[CheckMessage]:
    """Where BackpressureMiddleware stands in MIDDLEWARE, as docs/backpressure.md asks: last.
    By class, not by name: it is also importable from the module that defines it, or subclassed."""
    from django_prometheus.middleware import PrometheusAfterMiddleware

    from composition.backpressure import BackpressureMiddleware

    classes = _middleware_classes()
    ours = [index for index, (_, cls) in enumerate(classes) if cls and issubclass(cls, BackpressureMiddleware)]
    if not ours:
        if isinstance(paths, dict) and paths:
            return [Warning(f"BACKPRESSURE_PATHS is set but {BACKPRESSURE_MIDDLEWARE} is not in MIDDLEWARE: no "
                            "request is refused.", hint="MIDDLEWARE.append(...) (docs/backpressure.md)",
                            id="composition.W054")]
        return []
    after = [path for path, cls in classes[ours[0] + 1:] if cls and issubclass(cls, PrometheusAfterMiddleware)]
    if after:
        # The After middleware records a response on its way out: a 503 answered inside it is seen.
        return [Warning(f"{classes[ours[0]][0]} comes before {after[0]} in MIDDLEWARE: the requests it "
                        "refuses are missing from the HTTP metrics.",
                        hint="Put it last: MIDDLEWARE.append(...) (docs/backpressure.md)", id="composition.W055")]
    return []


@register("composition")
def check_shedding_settings(app_configs: Any = None, **_: Any) -> list[CheckMessage]:
    merged = merged_settings()
    if merged is None:
        return []
    messages = not_positive_seconds(merged, ("SHED_INTERVAL_S", "QUEUE_PAUSE_REFRESH_S", "QUEUE_HISTORY_BUCKET_S"),
                                     "composition.E130")
    after = merged["SHED_RESUME_AFTER_S"]
    if isinstance(after, bool) or not isinstance(after, int | float) or after < 0:
        messages.append(Error(f"COMPOSITION['SHED_RESUME_AFTER_S'] must be a number of seconds >= 0, got {after!r}.",
                              id="composition.E130"))
    below = merged["SHED_RESUME_BELOW"]
    if isinstance(below, bool) or not isinstance(below, int | float) or not 0 < below <= 1:
        messages.append(Error(f"COMPOSITION['SHED_RESUME_BELOW'] must be a share of the limits, above 0 and at "
                              f"most 1, got {below!r}.", hint="0.5: resume once every signal is below half its limit.",
                              id="composition.E131"))
    shed, essential = merged["SHED_QUEUES"], merged["SHED_ESSENTIAL_QUEUES"]
    if not isinstance(shed, list | tuple) or not all(isinstance(queue, str) for queue in shed):
        messages.append(Error("COMPOSITION['SHED_QUEUES'] must be a list of queue names.", id="composition.E132"))
        shed = []
    if essential is not None and (not isinstance(essential, list | tuple)
                                  or not all(isinstance(queue, str) for queue in essential)):
        messages.append(Error("COMPOSITION['SHED_ESSENTIAL_QUEUES'] must be a list of queue names or None.",
                              id="composition.E132"))
        essential = None
    from composition.outbox.relay import RELAY_QUEUE_NAME
    from composition.queues.pressure import SIGNALS

    if RELAY_QUEUE_NAME in shed:
        messages.append(Error(f"COMPOSITION['SHED_QUEUES'] names {RELAY_QUEUE_NAME!r}, the outbox relay's queue: "
                              "shedding it would stop every queue's jobs.", id="composition.E132"))
    if essential and set(shed) & set(essential):
        messages.append(Error(f"COMPOSITION: {sorted(set(shed) & set(essential))} are in both SHED_QUEUES and "
                              "SHED_ESSENTIAL_QUEUES: a queue cannot shed itself.", id="composition.E132"))
    when = merged["SHED_WHEN"]
    wrong = ([repr(when)] if not isinstance(when, dict) else
             [f"{signal!r}: {limit!r}" for signal, limit in when.items() if signal not in SIGNALS or (
                 limit is not None and (isinstance(limit, bool) or not isinstance(limit, int | float) or limit <= 0))])
    if wrong:
        messages.append(Error(f"COMPOSITION['SHED_WHEN'] must map signals of {list(SIGNALS)} to positive limits "
                              f"(or None: that signal off); not {', '.join(wrong)}.", id="composition.E133"))
    elif shed:
        measurable = {signal for signal, limit in when.items() if limit is not None}
        if str(merged["BROKER_URL"]).startswith("amqp"):
            measurable.discard("oldest_wait_s")
        if not measurable:
            messages.append(Warning(
                "COMPOSITION['SHED_QUEUES'] is set but no signal of SHED_WHEN can be measured on this broker: "
                "nothing is ever shed.",
                hint="On RabbitMQ a queue's oldest message cannot be timed without consuming it: set "
                     "SHED_WHEN['ready_messages'] (and/or 'db_latency_ms').", id="composition.W134"))
    return messages
