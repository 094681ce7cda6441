"""The ``django.tasks`` results in the admin, read-only: "what became of task X?" by the result id
a caller holds, with its arguments, attempts, errors and return value.

The status column is the record's; ``get_result`` reads a RUNNING record whose lease ran out as
READY (its worker died and its message is handed out again), which the lease column shows.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.utils.html import format_html

from composition.admin.dead_letters import ReadOnlyRows
from composition.admin.format import moment, moment_column
from composition.admin.ledger import EstimatedCountPaginator
from composition.jobs.models import TaskRecord

__all__ = ["TaskRecordAdmin"]


@admin.register(TaskRecord)
class TaskRecordAdmin(ReadOnlyRows, admin.ModelAdmin):
    list_display = ("id", "task_path", "status", "queue_name", "enqueued", "finished", "attempts")
    list_filter = ("status", "backend", "queue_name")
    search_fields = ("=id", "task_path")
    search_help_text = "The result id, exactly, or part of the task's module path."
    ordering = ("-enqueued_at",)
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    list_per_page = 50
    fields = ("id", "backend", "queue_name", "task_path", "priority", "status", "lease", "enqueued", "run_after",
              "started", "last_attempted", "finished", "workers", "pretty_args", "pretty_kwargs",
              "pretty_return_value", "pretty_errors", "message_id")
    readonly_fields = fields

    enqueued = moment_column("enqueued_at", "enqueued at", sortable=True)
    started = moment_column("started_at", "first run began")
    last_attempted = moment_column("last_attempted_at", "latest run began")
    finished = moment_column("finished_at", "finished at")

    @admin.display(description="running lease")
    def lease(self, obj: TaskRecord) -> str:
        return f"until {moment(obj.running_until)}" if obj.running_until is not None else "-"

    @admin.display(description="attempts")
    def attempts(self, obj: TaskRecord) -> int:
        return len(obj.worker_ids) if isinstance(obj.worker_ids, list) else 0

    @admin.display(description="workers (one per run)")
    def workers(self, obj: TaskRecord) -> str:
        return ", ".join(map(str, obj.worker_ids)) if isinstance(obj.worker_ids, list) and obj.worker_ids else "-"

    @admin.display(description="args")
    def pretty_args(self, obj: TaskRecord) -> str:
        return _pre(obj.args)

    @admin.display(description="kwargs")
    def pretty_kwargs(self, obj: TaskRecord) -> str:
        return _pre(obj.kwargs)

    @admin.display(description="return value")
    def pretty_return_value(self, obj: TaskRecord) -> str:
        return _pre(obj.return_value) if obj.status == TaskRecord.Status.SUCCESSFUL else "-"

    @admin.display(description="errors")
    def pretty_errors(self, obj: TaskRecord) -> str:
        if not isinstance(obj.errors, list) or not obj.errors:
            return "-"
        return format_html("<pre>{}</pre>", "\n\n".join(
            f"{error.get('exception_class_path', '')}\n{error.get('traceback', '')}"
            for error in obj.errors if isinstance(error, dict)))


def _pre(value: Any) -> str:
    return format_html("<pre>{}</pre>", json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))
