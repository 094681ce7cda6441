"""The example project's URLs plus views that exist only for the tests."""

import time

from django.http import HttpRequest, JsonResponse
from django.urls import path

from composition.backpressure import admit
from project.urls import urlpatterns as project_urlpatterns


def slow(request: HttpRequest) -> JsonResponse:
    """Answers after ``?seconds=`` (at most 30): a request in flight while a server drains."""
    seconds = min(30.0, float(request.GET.get("seconds", "1")))
    time.sleep(seconds)
    return JsonResponse({"slept_s": seconds})


def admitted(request: HttpRequest, queue: str) -> JsonResponse:
    """A view of a user's that calls ``admit(queue)`` itself and lets ``Backpressure`` rise."""
    admit(queue)
    return JsonResponse({"queued": True}, status=202)


urlpatterns = [path("test/slow", slow), path("test/admit/<str:queue>", admitted), *project_urlpatterns]
