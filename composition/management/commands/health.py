from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from composition import health

CHECKS = {"liveness": health.liveness, "readiness": lambda: health.readiness(use_cache=False),
          "workers": health.workers}


class Command(BaseCommand):
    help = "Exit 0 when healthy, 1 when not: liveness, readiness or workers."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("kind", choices=sorted(CHECKS))
        parser.add_argument("--json", action="store_true", help="print the report as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        report = CHECKS[options["kind"]]()
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
