"""API tokens: made, shown once, stored as their SHA-256, looked up by it; each expires
(``DEFAULT_LIFETIME`` unless its maker says otherwise), and an expired one is refused with its
own error, so a client can tell "make a new token" from "this token was never valid"."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from billing.models import ApiToken

__all__ = ["DEFAULT_LIFETIME", "TOKEN_PREFIX", "TokenExpired", "create_token", "user_for_token"]

TOKEN_PREFIX = "bil_"
# How long a token lives unless made with another lifetime (or none: ``lifetime=None``).
DEFAULT_LIFETIME = timedelta(days=90)
# last_used_at is written at most this often per token, so a busy client does not write a row
# per request.
LAST_USED_RESOLUTION_S = 60.0


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenExpired(Exception):
    """The token was valid until ``expires_at``."""

    def __init__(self, expires_at: datetime) -> None:
        super().__init__(f"the token expired at {expires_at.isoformat(timespec='seconds')}")
        self.expires_at = expires_at


def create_token(user: Any, name: str, *, replace: bool = False,
                 lifetime: timedelta | None = DEFAULT_LIFETIME) -> tuple[ApiToken, str]:
    """A new token of ``user`` named ``name``, valid for ``lifetime`` (None: until revoked);
    returns the row and the token (shown only now). ``replace`` deletes the user's token of that
    name first (a rotating dev token). Raises ValueError for a lifetime that is not positive."""
    if lifetime is not None and lifetime <= timedelta(0):
        raise ValueError(f"a token's lifetime must be positive, got {lifetime}")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    expires_at = timezone.now() + lifetime if lifetime is not None else None
    with transaction.atomic():
        if replace:
            ApiToken.objects.filter(user=user, name=name).delete()
        row = ApiToken.objects.create(user=user, name=name, digest=_digest(token), prefix=token[:12],
                                      expires_at=expires_at)
    return row, token


def user_for_token(token: str) -> Any | None:
    """The active user owning ``token``, or None (unknown token, inactive user). Raises
    ``TokenExpired`` for a token past its ``expires_at``."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    row = ApiToken.objects.select_related("user").filter(digest=_digest(token)).first()
    if row is None or not row.user.is_active:
        return None
    now = timezone.now()
    if row.expires_at is not None and now >= row.expires_at:
        raise TokenExpired(row.expires_at)
    if row.last_used_at is None or (now - row.last_used_at).total_seconds() > LAST_USED_RESOLUTION_S:
        ApiToken.objects.filter(pk=row.pk).update(last_used_at=now)
    return row.user
