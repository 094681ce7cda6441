"""``manage.py drain``: the pre-stop step of a web server (a container's preStop hook, or what
``./run`` does before it stops gunicorn)."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from composition.conf import conf
from composition.health.draining import clear_drain_file, drain_file, mark_drain_file

# A pre-stop step longer than an hour is a typo (a load balancer notices within seconds).
MAX_WAIT_S = 3600.0


class Command(BaseCommand):
    help = ("Mark this host's web processes draining (/readyz answers 503 \"draining\"), wait "
            "HEALTH_DRAIN_WAIT_S for load balancers to notice, then exit: stop the server after it. "
            "--clear withdraws the mark.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--wait", type=float, default=None, metavar="SECONDS",
                            help="seconds to wait after marking (default HEALTH_DRAIN_WAIT_S)")
        parser.add_argument("--clear", action="store_true", help="remove the mark (at server start)")

    def handle(self, *args: Any, **options: Any) -> None:
        path = drain_file()
        if path is None:
            raise CommandError("COMPOSITION['HEALTH_DRAIN_FILE'] is not set: there is no host-wide "
                               "draining mark to write. Set it to a path every web process can see.")
        if options["clear"]:
            if options["wait"] is not None:
                raise CommandError("--clear takes no --wait: it withdraws the mark at once")
            try:
                clear_drain_file(path)
            except OSError as exc:
                raise CommandError(f"could not remove the drain mark {path}: {exc}") from None
            self.stdout.write(f"drain mark cleared: {path}")
            return
        wait_s = float(conf.HEALTH_DRAIN_WAIT_S) if options["wait"] is None else options["wait"]
        # Refused before the mark is written: a wait that then failed would leave the host
        # draining, every web process answering /readyz 503, with nothing to stop it.
        if not 0 <= wait_s <= MAX_WAIT_S:
            raise CommandError(f"--wait must be between 0 and {MAX_WAIT_S:g} seconds, got {wait_s:g}")
        try:
            mark_drain_file(path)
        except OSError as exc:
            raise CommandError(f"could not write the drain mark {path}: {exc} (HEALTH_DRAIN_FILE must be a path "
                               "this user may write and every web process can see)") from None
        try:
            self.stdout.write(f"draining: {path} written; waiting {wait_s:g}s for load balancers")
            self.stdout.flush()
            time.sleep(wait_s)
        except KeyboardInterrupt:
            # The mark stays: the host keeps answering /readyz 503 until it is withdrawn.
            raise CommandError(f"interrupted: the host is still marked draining ({path}); "
                               "./manage.py drain --clear withdraws the mark", returncode=130) from None
