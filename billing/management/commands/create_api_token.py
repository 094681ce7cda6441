"""``manage.py create_api_token <username>``: a bearer token for the billing API, shown once."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import IntegrityError

from billing.tokens import create_token


class Command(BaseCommand):
    help = ("Create a bearer token of the billing API for an existing user and print it (only its "
            "hash is stored: it cannot be shown again). What the token may do is the user's "
            "permissions: billing.view_invoice, add_invoice, change_invoice (void), pay_invoice.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="default", help="tells the user's tokens apart (default 'default')")
        parser.add_argument("--replace", action="store_true",
                            help="delete the user's token of that name first (rotate it)")

    def handle(self, *args: Any, **options: Any) -> None:
        user_model = get_user_model()
        try:
            user = user_model.objects.get(**{user_model.USERNAME_FIELD: options["username"]})
        except user_model.DoesNotExist:
            raise CommandError(f"no user {options['username']!r}: create one first "
                               "(manage.py createsuperuser)") from None
        try:
            _, token = create_token(user, options["name"], replace=options["replace"])
        except IntegrityError:
            raise CommandError(f"{options['username']} already has a token named {options['name']!r}: "
                               "choose another --name, or --replace it") from None
        self.stdout.write(token)
