"""``manage.py create_api_token <username>``: a bearer token for the billing API, shown once."""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import IntegrityError

from billing.tokens import DEFAULT_LIFETIME, create_token


def _positive_days(text: str) -> float:
    try:
        days = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of days: {text!r}") from None
    if not 0 < days <= 36_500:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most 36500 days, got {text}")
    return days


class Command(BaseCommand):
    help = ("Create a bearer token of the billing API for an existing user and print it (only its "
            "hash is stored: it cannot be shown again). What the token may do is the user's "
            "permissions: billing.view_invoice, add_invoice, change_invoice (void), pay_invoice. "
            f"It expires after {DEFAULT_LIFETIME.days} days unless told otherwise.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="default", help="tells the user's tokens apart (default 'default')")
        parser.add_argument("--replace", action="store_true",
                            help="delete the user's token of that name first (rotate it)")
        lifetime = parser.add_mutually_exclusive_group()
        lifetime.add_argument("--expires-in-days", type=_positive_days, default=DEFAULT_LIFETIME.days, metavar="DAYS",
                              help=f"the token is refused after this many days (default {DEFAULT_LIFETIME.days})")
        lifetime.add_argument("--no-expiry", action="store_true",
                              help="the token is valid until revoked (in the admin, under Api tokens)")

    def handle(self, *args: Any, **options: Any) -> None:
        user_model = get_user_model()
        try:
            user = user_model.objects.get(**{user_model.USERNAME_FIELD: options["username"]})
        except user_model.DoesNotExist:
            raise CommandError(f"no user {options['username']!r}: create one first "
                               "(manage.py createsuperuser)") from None
        lifetime = None if options["no_expiry"] else timedelta(days=options["expires_in_days"])
        try:
            _, token = create_token(user, options["name"], replace=options["replace"], lifetime=lifetime)
        except IntegrityError:
            raise CommandError(f"{options['username']} already has a token named {options['name']!r}: "
                               "choose another --name, or --replace it") from None
        self.stdout.write(token)
