"""API tokens: made, shown once, stored as their SHA-256, looked up by it."""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from django.db import transaction
from django.utils import timezone

from billing.models import ApiToken

__all__ = ["TOKEN_PREFIX", "create_token", "user_for_token"]

TOKEN_PREFIX = "bil_"
# last_used_at is written at most this often per token, so a busy client does not write a row
# per request.
LAST_USED_RESOLUTION_S = 60.0


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(user: Any, name: str, *, replace: bool = False) -> tuple[ApiToken, str]:
    """A new token of ``user`` named ``name``; returns the row and the token (shown only now).
    ``replace`` deletes the user's token of that name first (a rotating dev token)."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        if replace:
            ApiToken.objects.filter(user=user, name=name).delete()
        row = ApiToken.objects.create(user=user, name=name, digest=_digest(token), prefix=token[:12])
    return row, token


def user_for_token(token: str) -> Any | None:
    """The active user owning ``token``, or None (unknown token, inactive user)."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    row = ApiToken.objects.select_related("user").filter(digest=_digest(token)).first()
    if row is None or not row.user.is_active:
        return None
    now = timezone.now()
    if row.last_used_at is None or (now - row.last_used_at).total_seconds() > LAST_USED_RESOLUTION_S:
        ApiToken.objects.filter(pk=row.pk).update(last_used_at=now)
    return row.user
