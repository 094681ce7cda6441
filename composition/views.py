"""Health and metrics endpoints: thin wrappers over composition.health.checks."""

from __future__ import annotations

import structlog
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_safe

from composition.health import checks as health
from composition.logging import already_logged
from composition.prometheus import MetricsAccess, MetricsDirectoryBusy, render, scrape_registry

log = structlog.get_logger("composition.health")


@never_cache
@csrf_exempt  # a POST is answered 405, not with the CSRF failure page
@require_safe
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness: answers without touching any dependency."""
    return JsonResponse(health.liveness().as_dict())


@never_cache
@csrf_exempt
@require_safe
def readyz(request: HttpRequest) -> JsonResponse:
    """Readiness: 200 when every critical dependency answers, 503 (naming it) otherwise."""
    report = health.readiness()
    failing = {check.name: check.error for check in report.checks if not check.ok}
    if failing:
        log.warning("readiness check failing", failing=failing, ok=report.ok)
    response = JsonResponse(report.as_dict(public=True), status=200 if report.ok else 503)
    # A 503 is never Django's "Service Unavailable" ERROR line: a failing check is logged above,
    # and a drain once when it begins, not at every probe of it.
    return response if report.ok else already_logged(response)


@never_cache
@csrf_exempt
@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus exposition, merged across processes in multiprocess mode (read under the
    directory's lock, which django-prometheus' own view does not take). 403 or 401 when the
    access policy refuses the caller, 503 while the directory stays locked."""
    refusal = MetricsAccess.from_settings().refusal(authorization=request.headers.get("Authorization"),
                                                    client_address=request.META.get("REMOTE_ADDR"))
    if refusal is not None:
        return HttpResponse(refusal.reason + "\n", status=refusal.status, headers=refusal.headers,
                            content_type="text/plain; charset=utf-8")
    try:
        body, content_type = render(scrape_registry(), request.headers.get("Accept", ""))
    except MetricsDirectoryBusy:
        log.warning("metrics scrape refused: directory busy")
        response = HttpResponse("metrics directory busy, retry\n", status=503, content_type="text/plain; charset=utf-8")
        response["Retry-After"] = "1"
        return already_logged(response)
    return HttpResponse(body, content_type=content_type)
