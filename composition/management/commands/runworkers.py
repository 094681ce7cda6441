from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from composition.conf import conf
from composition.errors import SystemStartError
from composition.lifecycle.workers import WorkerOptions, build_supervisor, build_worker_system


def _option_or(options: dict[str, Any], name: str, default: Any) -> Any:
    """The command-line value of ``name``, or ``default`` when it was not given."""
    return default if options[name] is None else options[name]


class Command(BaseCommand):
    help = ("Run Dramatiq workers (and the outbox relay) as one composed system. SIGTERM/SIGINT "
            "drains gracefully; a second signal exits at once.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--processes", type=int, default=None, help="worker processes (default from settings)")
        parser.add_argument("--threads", type=int, default=None, help="worker threads per process")
        parser.add_argument("--queues", default=None, help="comma-separated queue names (default: all)")
        parser.add_argument("--shutdown-timeout", type=float, default=None, dest="shutdown_timeout",
                            help="seconds to drain after the first signal")

    def handle(self, *args: Any, **options: Any) -> None:
        defaults = WorkerOptions.from_settings()
        queues = [q.strip() for q in options["queues"].split(",") if q.strip()] if options["queues"] else None
        worker_options = WorkerOptions(
            processes=_option_or(options, "processes", defaults.processes),
            threads=_option_or(options, "threads", defaults.threads),
            queues=queues or defaults.queues,
            shutdown_timeout_s=_option_or(options, "shutdown_timeout", float(conf.SHUTDOWN_TIMEOUT_S)),
        )
        if worker_options.processes < 1 or worker_options.threads < 1:
            raise CommandError("--processes and --threads must be at least 1")
        if worker_options.shutdown_timeout_s <= 0:
            raise CommandError("--shutdown-timeout must be a positive number of seconds")
        system = (build_worker_system(worker_options) if worker_options.processes == 1
                  else build_supervisor(worker_options))
        try:
            report = system.run()
        except SystemStartError as exc:
            raise CommandError(str(exc)) from exc
        if any(result.status != "stopped" for result in report):
            raise CommandError("some components did not stop cleanly: "
                               + ", ".join(f"{r.name}={r.status}" for r in report if r.status != "stopped"))
