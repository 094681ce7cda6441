"""Shared set-up and timing for the benchmarks.

Timing: the candidate and its baseline run in many short alternating rounds in the same process
(so drift and noisy neighbours hit both alike), and each side's fastest round is reported: on a
shared machine the slow rounds measure the neighbours, the fastest one measures the code.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path


def setup_django(settings_module: str = "project.settings") -> None:
    """Set Django up and migrate, so a benchmark runs on a fresh database too."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", settings_module)
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def compare(candidate: Callable[[], object], baseline: Callable[[], object], *, calls: int,
            rounds: int) -> tuple[float, float]:
    """(candidate, baseline) seconds per call: the fastest of ``rounds`` alternating rounds."""
    for fn in (candidate, baseline):  # warm up connections, scripts and caches
        for _ in range(max(10, calls // 10)):
            fn()
    per_call: dict[str, list[float]] = {"candidate": [], "baseline": []}
    for i in range(rounds):
        order = [("candidate", candidate), ("baseline", baseline)]
        for label, fn in order if i % 2 == 0 else reversed(order):
            started = time.perf_counter()
            for _ in range(calls):
                fn()
            per_call[label].append((time.perf_counter() - started) / calls)
    return min(per_call["candidate"]), min(per_call["baseline"])


def report(title: str, baseline_name: str, candidate_s: float, baseline_s: float, goal: float) -> bool:
    ratio = candidate_s / baseline_s
    verdict = "ok" if ratio <= goal else "OVER GOAL"
    print(f"{title} vs {baseline_name}: {ratio:.2f}x (goal <= {goal}x) "
          f"[{candidate_s * 1e6:.1f} us vs {baseline_s * 1e6:.1f} us per call] {verdict}")
    return ratio <= goal


def fill_outbox(actor_name: str, queue_name: str, count: int) -> None:
    """``count`` pending outbox rows for ``actor_name`` (payload ``{"seq": n}``), written in one
    transaction as ``publish()`` would write them, for a relay to drain."""
    from django.db import transaction

    from composition.outbox import OutboxMessage

    now = time.time()
    with transaction.atomic():
        OutboxMessage.objects.bulk_create(
            [OutboxMessage(actor_name=actor_name, queue_name=queue_name, payload={"seq": seq},
                           headers={"request_id": None, "published_at": now}) for seq in range(count)],
            batch_size=2000)
