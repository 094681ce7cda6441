"""Calling a task as a worker does: a coroutine function in an event loop of its own, within the
run's time limit; and its return value as its result keeps it."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from asgiref.sync import async_to_sync
from dramatiq.middleware.time_limit import TimeLimitExceeded

from composition.conf import conf
from composition.outbox.payload_json import storable_json
from composition.tasks._compat import Task, normalize_json
from composition.tasks.errors import InvalidTaskReturnValue

__all__ = ["call", "kept_value"]


def call(task: Task[Any, Any], args: list[Any], kwargs: dict[str, Any], *, timeout_s: float) -> Any:
    """The task's function called. A coroutine function runs to its end in an event loop of its
    own (``async_to_sync``, as Django's ``Task.call`` runs it), where the ORM's async calls run
    back on this worker thread, its connection and its transaction (the ledger's, for an atomic
    run); and within ``timeout_s``: the job's time limit cannot interrupt a thread that waits for
    a coroutine, so the coroutine is cancelled at that limit itself (``TimeLimitExceeded``,
    retried as an overrun is)."""
    if not inspect.iscoroutinefunction(task.func):
        return task.func(*args, **kwargs)

    async def bounded() -> Any:
        # Not wait_for: a TimeoutError of the task's own must stay its own.
        running = asyncio.ensure_future(task.func(*args, **kwargs))
        done, _ = await asyncio.wait({running}, timeout=timeout_s)
        if not done:
            running.cancel()
            await asyncio.wait({running})
            raise TimeLimitExceeded(f"the task ran over its time limit of {timeout_s:g} s")
        return running.result()

    return async_to_sync(bounded)()


def kept_value(path: str, value: Any) -> Any:
    """``value`` as its result keeps it (JSON, as ``normalize_json`` makes it); raises
    ``InvalidTaskReturnValue`` for what is not JSON, cannot be stored, or is too large."""
    try:
        kept = normalize_json(value)
        size = len(storable_json(kept, "the return value"))
    except (TypeError, ValueError) as exc:
        raise InvalidTaskReturnValue(f"{path} returned {type(value).__name__}, which a result cannot keep: "
                                     f"{exc}") from None
    limit = int(conf.TASK_RETURN_VALUE_MAX_BYTES)
    if size > limit:
        raise InvalidTaskReturnValue(f"{path} returned {size} bytes of JSON, over TASK_RETURN_VALUE_MAX_BYTES "
                                     f"({limit})")
    return kept
