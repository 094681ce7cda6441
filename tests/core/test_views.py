import pytest
from django.test import Client


def test_healthz_answers_without_dependencies(client: Client) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics"])
def test_a_post_to_a_probe_is_refused_as_a_method_not_a_forgery(path: str) -> None:
    # It was 403 with Django's CSRF failure page, which reads as a permission problem.
    response = Client(enforce_csrf_checks=True).post(path)
    assert response.status_code == 405 and response["Allow"] == "GET, HEAD"
