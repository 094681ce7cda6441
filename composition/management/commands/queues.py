"""``manage.py queues list | pause NAME | resume NAME``."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError

from composition.management.pause_command import PauseCommand, pause_json, paused_state
from composition.queues import QueueNotPausable, QueueRow, pause_queue, queue_rows, resume_queue


def _json_row(row: QueueRow) -> dict[str, Any]:
    return {
        "name": row.name, "depth": row.depth, "outbox_pending": row.outbox_pending,
        "broker": None if row.broker is None else {"ready": row.broker.ready, "delayed": row.broker.delayed,
                                                   "in_flight": row.broker.in_flight},
        "broker_error": row.broker_error, "oldest_age_s": row.oldest_age_s,
        "paused": pause_json(row.pause),
    }


class Command(PauseCommand):
    help = ("List the queues (depth, oldest waiting work, paused or not, by whom, since when, why), or pause "
            "or resume one for every worker host, durably. A paused queue starts no job; running ones finish, "
            "its messages wait on the broker, and publishing into it goes on.")
    thing = "queue"

    def pause_one(self, name: str, *, by: str, reason: str, user: Any) -> str:
        try:
            _, changed = pause_queue(name, by=by, reason=reason, user=user)
        except QueueNotPausable as exc:
            raise CommandError(str(exc)) from exc
        return f"queue {name} paused: no job of it starts on any worker from now on" if changed \
            else f"queue {name} was paused already"

    def resume_one(self, name: str, *, by: str, reason: str, user: Any) -> str:
        try:
            _, changed = resume_queue(name, by=by, reason=reason, user=user)
        except QueueNotPausable as exc:
            raise CommandError(str(exc)) from exc
        return f"queue {name} resumed: its waiting jobs run" if changed else f"queue {name} was not paused"

    def list_rows(self, as_json: bool) -> None:
        rows = queue_rows()
        if as_json:
            self.stdout.write(json.dumps({"queues": [_json_row(row) for row in rows]}, indent=2))
            return
        if not rows:
            self.stdout.write("no queues declared")
            return
        lines = []
        for row in rows:
            depth = "?" if row.depth is None else str(row.depth)
            if row.broker_error:
                depth += f" (broker: {row.broker_error})"
            oldest = "-" if row.oldest_age_s is None else f"{row.oldest_age_s:.1f} s"
            lines.append((row.name, depth, oldest, paused_state(row.pause)))
        self.write_table(("name", "depth", "oldest waiting", "state"), lines)
