"""django-prometheus' ``PrometheusAfterMiddleware``, with every ``method`` label bounded.

Its request-latency family (``django_http_requests_latency_seconds_by_view_method``) takes the
request's method as sent, where its other families map an unknown method to ``<invalid
method>``: anyone could create series at will (``curl -X BOGUS1``, ``-X BOGUS2``, ...), one set
of histogram buckets each, in every process's metrics files. Use this class in its place.
"""

from __future__ import annotations

from typing import Any

from django_prometheus import middleware

__all__ = ["PrometheusAfterMiddleware"]


class PrometheusAfterMiddleware(middleware.PrometheusAfterMiddleware):
    def label_metric(self, metric: Any, request: Any, response: Any = None, **labels: Any) -> Any:
        if "method" in labels:
            labels["method"] = self._method(request)  # the known methods, else "<invalid method>"
        return super().label_metric(metric, request, response, **labels)
