"""``manage.py dev_setup --token-name NAME``: ``./run``'s start-up steps in one process.

Migrations, static files, the draining mark of an earlier life withdrawn, the development
superuser admin/admin (when no superuser exists) and a fresh API token of it, printed alone on
the last line of standard output. Example project only: never run it in production.
"""

from __future__ import annotations

from io import StringIO
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser


class Command(BaseCommand):
    help = ("./run's start-up steps: migrate, collectstatic, drain --clear, the development superuser "
            "admin/admin, and a fresh API token of it printed on the last line (example project only).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--token-name", default="./run", help="the token's name; an earlier one of it is replaced")

    def handle(self, *args: Any, **options: Any) -> None:
        # Its progress on standard error: standard output carries the token alone.
        call_command("migrate", interactive=False, verbosity=options["verbosity"], stdout=self.stderr)
        call_command("collectstatic", interactive=False, verbosity=0)
        # A mark left by a run that was killed would keep the new web server draining.
        call_command("drain", clear=True, stdout=StringIO())
        user_model = get_user_model()
        if not user_model.objects.filter(is_superuser=True).exists():
            user_model.objects.create_superuser("admin", "admin@example.invalid", "admin")
            self.stderr.write("created superuser admin / admin")
        token = StringIO()
        # The superuser may have been made by hand under another name: the token is admin's only
        # when there is an admin.
        if user_model.objects.filter(username="admin").exists():
            try:
                call_command("create_api_token", "admin", name=options["token_name"], replace=True, stdout=token)
            except CommandError as exc:  # no token this run; everything else still works
                self.stderr.write(f"no API token made for admin: {exc}")
        self.stdout.write(token.getvalue().strip())
