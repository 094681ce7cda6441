"""The app's URLs: health probes and metrics (``include('composition.urls')``)."""

from django.urls import path

from composition import views
from composition.conf import require_installed

require_installed("include('composition.urls')")

urlpatterns = [
    path("healthz", views.healthz, name="composition-healthz"),
    path("readyz", views.readyz, name="composition-readyz"),
    path("metrics", views.metrics, name="composition-metrics"),
]
