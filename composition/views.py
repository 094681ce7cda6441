"""Health and metrics endpoints: thin wrappers over composition.health."""

from __future__ import annotations

import structlog
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from composition import health

log = structlog.get_logger("composition.health")


@never_cache
@require_safe
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness: answers without touching any dependency."""
    return JsonResponse(health.liveness().as_dict())


@never_cache
@require_safe
def readyz(request: HttpRequest) -> JsonResponse:
    """Readiness: 200 when every critical dependency answers, 503 (naming it) otherwise."""
    report = health.readiness()
    failing = {check.name: check.error for check in report.checks if not check.ok}
    if failing:
        log.warning("readiness check failing", failing=failing, ok=report.ok)
    return JsonResponse(report.as_dict(public=True), status=200 if report.ok else 503)


@never_cache
@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text format, merged across processes in multiprocess mode."""
    from django_prometheus.exports import ExportToDjangoView

    return ExportToDjangoView(request)
