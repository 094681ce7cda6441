"""The checks a deploy needs: declared schedules that can run, a pooled database's settings,
and (with a database) queued work the running code cannot run."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import DEFAULT_DB_ALIAS

from composition.checks.common import configured_broker_or_none
from composition.conf import conf
from composition.db.pooling import check_pooled_settings, check_pooled_timeouts

__all__ = ["check_queued_work", "check_schedules"]


@register("composition")
def check_schedules(app_configs: Any = None, **_: Any) -> list[CheckMessage]:
    """Every declared schedule can run: a bad expression, an unknown zone or a payload its job
    refuses is reported now, naming the schedule, not at its first tick."""
    from composition.schedules import declared
    from composition.schedules.declaration import duplicate_names
    from composition.schedules.problems import problems

    broker = configured_broker_or_none()
    if broker is None:
        return []
    # A job's aliases are its old names (@job(aliases=...)), registered as its actor.
    renamed_jobs: dict[str, list[str]] = {}
    for registered, actor in broker.actors.items():
        if registered != actor.actor_name:
            renamed_jobs.setdefault(actor.actor_name, []).append(registered)

    messages: list[CheckMessage] = [
        Error(f"schedule {name!r} is declared twice with different arguments.",
              hint="Give one of them another name= (the name keys the schedule's state).", id="composition.E120")
        for name in sorted(set(duplicate_names()), key=str)]
    for name, entry in declared().items():
        messages += [Error(f"schedule {name!r}: {problem}.", id="composition.E121") for problem in problems(entry)]
        if entry.named_after_job and entry.actor_name in renamed_jobs:
            old = renamed_jobs[entry.actor_name]
            # Which old name the running code's schedule has is not known here: with one alias it
            # is that one; with several, the job's name before this rename.
            keep = (f"name={old[0]!r}" if len(old) == 1 else
                    f"name= the schedule's name in the code running now (one of {', '.join(map(repr, old))}: "
                    "the job's name before this rename)")
            messages.append(Warning(
                f"schedule {name!r} is named after its job, which was renamed from {', '.join(map(repr, old))}: "
                "while hosts with the code from before run, they fire the schedule under its old name beside "
                "this one (every tick twice), and this one starts afresh, without the old one's state or pause.",
                hint=f"Give it {keep} to keep one schedule (or name={name!r} to start afresh on purpose).",
                id="composition.W123"))
    # Tick rows are what an operator reads back of a catch-up: kept at least as long as a window.
    keep_s = conf.SCHEDULE_TICK_RETENTION_S
    windows = [(entry.catch_up_window.total_seconds(), name) for name, entry in declared().items()
               if entry.catch_up == "all" and isinstance(entry.catch_up_window, timedelta)]
    if keep_s is not None and windows and isinstance(keep_s, int | float) and max(windows)[0] > keep_s:
        window_s, name = max(windows)
        messages.append(Warning(
            f"COMPOSITION['SCHEDULE_TICK_RETENTION_S'] ({keep_s:g} s) is shorter than schedule {name!r}'s "
            f"catch_up_window ({window_s:g} s): its caught-up ticks would be pruned while still inside it.",
            hint="Raise SCHEDULE_TICK_RETENTION_S above the largest catch-up window.", id="composition.W122"))
    return messages


# Databases behind a transaction pooler: the settings they need, and (with database access) the
# role's timeouts read through the pooler.
register("composition")(check_pooled_settings)
register(Tags.database)(check_pooled_timeouts)


@register(Tags.database)
def check_queued_work(app_configs: Any = None, databases: Any = None, **_: Any) -> list[CheckMessage]:
    """Queued work the running code cannot run (``manage.py jobs check-compat``'s database part),
    only when a database is named: ``check --database default``, and ``migrate``, which runs the
    database checks first. So a warning, not an error: migrating comes before this check in a
    deploy and must not be stopped by it (a pipeline runs ``jobs check-compat``, which exits 1).
    Nothing before the first migrate, when the tables are not there yet."""
    if not databases or DEFAULT_DB_ALIAS not in databases:
        return []
    from django.db import connections

    from composition.jobs.compatibility import queued_problems, reads_tables

    broker = configured_broker_or_none()
    if broker is None or not set(reads_tables()) <= set(connections[DEFAULT_DB_ALIAS].introspection.table_names()):
        return []
    return [Warning(f"{problem.count} {problem.source} of {problem.actor} (e.g. id {problem.example_id}): "
                    f"{problem.reason}.", hint="manage.py jobs check-compat lists them and exits 1; "
                    "docs/deployment.md says what to do before deploying.", id="composition.W140")
            for problem in queued_problems(broker)]
