"""``manage.py health``: liveness, readiness or worker health as an exit code, for probes."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from composition import health


class Command(BaseCommand):
    help = ("Exit 0 when healthy, 1 when not: liveness; readiness (of the web role, or with "
            "--role worker of a worker); workers (the cluster's heartbeats, or with --local only "
            "this host's processes: a container's healthcheck).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("kind", choices=["liveness", "readiness", "workers"])
        parser.add_argument("--role", choices=health.ROLES, default="web",
                            help="readiness: whose dependencies count as critical (default web)")
        parser.add_argument("--local", action="store_true",
                            help="workers: only this host's worker processes")
        parser.add_argument("--json", action="store_true", help="print the report as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        kind = options["kind"]
        # A misused flag exits 2, as argparse's own usage errors do: a healthcheck must not read
        # a typo in its own command as "unhealthy".
        if options["local"] and kind != "workers":
            raise CommandError("--local applies to `health workers` only", returncode=2)
        if options["role"] != "web" and kind != "readiness":
            raise CommandError("--role applies to `health readiness` only", returncode=2)
        if kind == "liveness":
            report = health.liveness()
        elif kind == "readiness":
            report = health.readiness(use_cache=False, role=options["role"])
        else:
            report = health.workers(local=options["local"])
        body = report.as_dict()
        if options["json"]:
            self.stdout.write(json.dumps(body, indent=2, default=str))
        else:
            self.stdout.write(f"{report.kind}: {'ok' if report.ok else 'FAIL'}")
            for check in report.checks:
                state = "ok" if check.ok else ("FAIL" if check.critical else "degraded")
                line = f"  {check.name}: {state} ({check.duration_s * 1000:.0f} ms)"
                self.stdout.write(line + (f" {check.error}" if check.error else ""))
            for key, value in report.detail.items():
                if key != "workers":
                    self.stdout.write(f"  {key}: {value}")
        if not report.ok:
            raise SystemExit(1)
