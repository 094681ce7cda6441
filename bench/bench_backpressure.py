"""What ``BackpressureMiddleware`` adds to a request it admits, against the same view without it.

Both sides run a POST under a ``BACKPRESSURE_PATHS`` prefix through Django's request handler
(URL resolution, the view, the response), one with the middleware as its only middleware and
one with none, so the difference is the middleware: the path match, ``admit()`` reading the
queue's depth (re-measured every ``BACKPRESSURE_CACHE_S``, inside the timed rounds like in
production) and the limit check. The view is trivial on purpose: a real view's milliseconds
would drown the microseconds measured. The queue is below its limit, so every request passes.

Reported: the median over alternating rounds of each side's time per request, their ratio, and
the time added. Goal: <= 10 us added per request.
Run: ``python bench/bench_backpressure.py`` (BENCH_CALLS, BENCH_ROUNDS to tune).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable

from _util import setup_django

setup_django()

from django.conf import settings  # noqa: E402
from django.core.handlers.base import BaseHandler  # noqa: E402
from django.http import HttpRequest, HttpResponse  # noqa: E402
from django.test import RequestFactory, override_settings  # noqa: E402
from django.urls import path  # noqa: E402

CALLS = int(os.environ.get("BENCH_CALLS", "2000"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "41"))
GOAL_ADDED_S = 10e-6
MIDDLEWARE = "composition.backpressure.BackpressureMiddleware"


def pay(request: HttpRequest, invoice_id: int) -> HttpResponse:
    return HttpResponse(b'{"created": true}', status=201, content_type="application/json")


# This module is the URLconf of the requests below (request.urlconf).
urlpatterns = [path("api/invoices/<int:invoice_id>/pay", pay)]


def handler(middleware: list[str]) -> BaseHandler:
    with override_settings(MIDDLEWARE=middleware):
        built = BaseHandler()
        built.load_middleware()
    return built


def request_runner(built: BaseHandler) -> Callable[[], object]:
    request = RequestFactory().post("/api/invoices/42/pay", data=b'{"payment_id": "p-1", "amount_cents": 4200}',
                                    content_type="application/json")
    request.urlconf = sys.modules[__name__]  # type: ignore[attr-defined]

    def run() -> object:
        response = built.get_response(request)
        assert response.status_code == 201, response.status_code
        return response

    return run


def medians(candidate: Callable[[], object], baseline: Callable[[], object]) -> tuple[float, float]:
    """(candidate, baseline) seconds per call: the median of ``ROUNDS`` alternating rounds."""
    for fn in (candidate, baseline):  # warm up: the first admit measures the depth
        for _ in range(max(10, CALLS // 10)):
            fn()
    per_call: dict[str, list[float]] = {"candidate": [], "baseline": []}
    for i in range(ROUNDS):
        order = [("candidate", candidate), ("baseline", baseline)]
        for label, fn in order if i % 2 == 0 else reversed(order):
            started = time.perf_counter()
            for _ in range(CALLS):
                fn()
            per_call[label].append((time.perf_counter() - started) / CALLS)
    return statistics.median(per_call["candidate"]), statistics.median(per_call["baseline"])


def main() -> int:
    # Its own path and limit: the example admits payments in its service, not by path.
    with override_settings(COMPOSITION={**settings.COMPOSITION, "BACKPRESSURE_QUEUES": {"billing": 10_000},
                                        "BACKPRESSURE_PATHS": {"/api/invoices": "billing"}}):
        with_s, without_s = medians(request_runner(handler([MIDDLEWARE])), request_runner(handler([])))
    added_s = with_s - without_s
    ok = added_s <= GOAL_ADDED_S
    print(f"backpressure middleware vs the same view without it: {with_s / without_s:.2f}x "
          f"[{with_s * 1e6:.1f} us vs {without_s * 1e6:.1f} us per request, median of {ROUNDS} rounds]; "
          f"added {added_s * 1e6:.2f} us (goal <= {GOAL_ADDED_S * 1e6:.0f} us) {'ok' if ok else 'OVER GOAL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
