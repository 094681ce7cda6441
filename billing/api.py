"""The JSON API's frame: authentication, CSRF, permissions, methods and errors, so each view in
``billing.views`` only parses, calls a service and answers.

- API clients send ``Authorization: Bearer <token>``; only those requests skip CSRF (a browser
  never adds that header by itself, so a forged cross-site request cannot carry one).
- Browsers use their Django session, with CSRF checked on unsafe methods.
- Anonymous: 401; authenticated without the permission: 403; nothing is read or written first.
- A body the API will not read is refused from its headers, before anything else: chunked
  (411: Django reads ``Content-Length`` bytes only, so it would see an empty body) or over
  ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (413).
- Every error is JSON ``{"code": ..., "error": ...}`` with a stable ``code``, a client's mistake
  included: none reaches Django's own (HTML) error pages or its error-level log lines.
- The database not answering is 503 ``unavailable`` with ``Retry-After``: a client may retry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import Any

import structlog
from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse, UnreadablePostError
from django.http.multipartparser import MultiPartParserError
from django.middleware.csrf import CsrfViewMiddleware, get_token
from django.views.decorators.csrf import csrf_exempt

from billing.tokens import TokenExpired, user_for_token
from composition.logging import already_logged

__all__ = ["ApiError", "endpoint", "error_response", "not_found"]

log = structlog.get_logger("billing.api")

# Retry-After of a request the database did not answer: a restart or a failover takes seconds.
DATABASE_RETRY_AFTER_S = 5

Handler = Callable[..., HttpResponse]


class ApiError(Exception):
    """An answer other than success: raised anywhere below a view, turned into JSON here."""

    def __init__(self, status: int, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.extra = status, code, message, extra


def error_response(status: int, code: str, message: str, **extra: Any) -> JsonResponse:
    response = JsonResponse({"code": code, "error": message, **extra}, status=status)
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="billing"'
    return response


@csrf_exempt  # it changes nothing; Django's CSRF check would answer an HTML 403 (and read the body)
def not_found(request: HttpRequest, **kwargs: Any) -> JsonResponse:
    """Any path under ``/api/`` that no endpoint matches (an id that is not a number, a
    trailing slash): 404 ``not_found``, whatever the method, before authentication."""
    hint = "; paths take no trailing slash" if request.path.endswith("/") else ""
    return error_response(404, "not_found", f"no endpoint at {request.path}{hint}")


def _body_too_large() -> ApiError:
    return ApiError(413, "body_too_large", f"the body is over {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes")


def _check_framing(request: HttpRequest) -> None:
    """Refuse, from the headers alone, a body this API will not read."""
    if "HTTP_TRANSFER_ENCODING" in request.META:
        raise ApiError(411, "length_required", "send the body with a Content-Length header, not chunked")
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0  # as Django reads it: no body
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    if limit is not None and length > limit:
        raise _body_too_large()


@contextmanager
def _unreadable_input() -> Iterator[None]:
    """Input Django cannot read (the body, by a handler or by a session's CSRF check reading a
    form; or too many query parameters) is the client's mistake: a JSON 4xx here, where Django
    would answer with an HTML page and log an error-level line."""
    try:
        yield
    except RequestDataTooBig:
        raise _body_too_large() from None
    except (TooManyFieldsSent, TooManyFilesSent) as exc:
        raise ApiError(400, "too_many_fields", str(exc)) from None
    except (MultiPartParserError, UnreadablePostError) as exc:
        raise ApiError(400, "invalid_body", f"the body cannot be read: {exc}"[:200]) from None


def _csrf_failure(request: HttpRequest) -> str | None:
    """The reason Django's CSRF check refuses ``request``, or None when it passes."""
    reasons: list[str] = []

    class Check(CsrfViewMiddleware):
        def _reject(self, request: HttpRequest, reason: str) -> HttpResponse | None:
            reasons.append(reason)
            return HttpResponse(status=403)

    Check(lambda _: HttpResponse()).process_view(request, lambda _: HttpResponse(), (), {})
    return reasons[0] if reasons else None


def _authenticate(request: HttpRequest) -> Any:
    header = request.headers.get("Authorization")
    if header is not None:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, "invalid_token", "the Authorization header must be 'Bearer <token>'")
        try:
            user = user_for_token(token.strip())
        except TokenExpired as exc:
            raise ApiError(401, "token_expired", f"{exc}; make a new one (manage.py create_api_token)") from exc
        if user is None:
            raise ApiError(401, "invalid_token", "the token is unknown or revoked")
        return user
    if not request.user.is_authenticated:
        raise ApiError(401, "not_authenticated",
                       "authenticate with 'Authorization: Bearer <token>' or a logged-in session")
    if request.method not in ("GET", "HEAD", "OPTIONS", "TRACE") and (reason := _csrf_failure(request)):
        raise ApiError(403, "csrf_failed", f"CSRF check failed: {reason}")
    return request.user


def endpoint(**handlers: tuple[str, Handler]) -> Handler:
    """One URL's view: ``GET=("billing.view_invoice", handler), POST=(...)``. Each handler runs
    only for its method, after the body's framing check, authentication, CSRF and its
    permission; ``ApiError`` (and input Django cannot read) becomes a JSON error answer."""
    allowed = sorted(handlers)

    @csrf_exempt  # checked in _authenticate, for session requests only
    @wraps(next(iter(handlers.values()))[1])
    def view(request: HttpRequest, **kwargs: Any) -> HttpResponse:
        method = "GET" if request.method == "HEAD" else (request.method or "GET")
        if "Authorization" not in request.headers:
            # A browser reads the CSRF token it must send back from this cookie. A bearer-token
            # client needs none, and gets no Set-Cookie (nor the per-request token it costs).
            get_token(request)
        try:
            _check_framing(request)
            with _unreadable_input():
                user = _authenticate(request)
                if method not in handlers:
                    response = error_response(405, "method_not_allowed", f"{request.method} is not allowed here; "
                                              f"use {' or '.join(allowed)}")
                    response["Allow"] = ", ".join(allowed)
                    return response
                permission, handler = handlers[method]
                if not user.has_perm(permission):
                    raise ApiError(403, "permission_denied", f"this needs the permission {permission!r}")
                request.user = user
                return handler(request, **kwargs)
        except ApiError as exc:
            if exc.status == 503:
                # Work shed on purpose (reminders): a warning, not Django's error line.
                log.warning("request shed", code=exc.code, path=request.path)
            return _answer(exc)
        except (OperationalError, InterfaceError) as exc:
            # The database away (down, failing over, a statement timeout): a client may retry.
            # Whatever this request wrote rolled back, or, when the COMMIT itself was cut, the
            # retry is answered as the repeat it is (a payment's payment_id).
            log.warning("database unavailable", path=request.path, error=str(exc)[:300])
            return _answer(ApiError(503, "unavailable", "the database is not answering; retry shortly",
                                    retry_after_s=DATABASE_RETRY_AFTER_S))

    return view


def _answer(exc: ApiError) -> JsonResponse:
    response = error_response(exc.status, exc.code, exc.message, **exc.extra)
    if exc.status in (409, 503) and exc.extra.get("retry_after_s"):
        response["Retry-After"] = str(exc.extra["retry_after_s"])
    if exc.status == 503:
        already_logged(response)  # logged as a warning where it was decided, not as Django's error line
    return response
