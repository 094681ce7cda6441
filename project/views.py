"""The example project's front page: where to go from ``/`` (and the admin's "View site")."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_safe

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Billing example</title></head>
<body>
<h1>Billing example</h1>
<p>The example app of django-backend-composition.</p>
<ul>
<li><a href="/admin/">Admin</a>: invoices, dead letters, the outbox, operations</li>
<li><a href="/api/invoices">/api/invoices</a>: the billing API
  (JSON; send <code>Authorization: Bearer &lt;token&gt;</code>)</li>
<li><a href="/healthz">/healthz</a> (liveness), <a href="/readyz">/readyz</a> (readiness)</li>
<li><a href="/metrics">/metrics</a>: Prometheus</li>
</ul>
</body></html>
"""


@require_safe
def index(request: HttpRequest) -> HttpResponse:
    return HttpResponse(PAGE)
