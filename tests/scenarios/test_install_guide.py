"""The install guide (docs/install.md), followed literally: a wheel, a fresh virtual environment,
a project from ``django-admin startproject``, the guide's marked blocks applied as written, then
``migrate``, ``check``, ``health readiness`` and one job: ``publish`` → ``runworkers`` → its
effect in the database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis
from django.conf import settings

from tests.helpers import ROOT, marked_block

# Slow (a virtual environment installed from the registry) and about packaging, not versions:
# the main cell only.
pytestmark = [pytest.mark.slow, pytest.mark.main_cell]


def guide_block(marker: str) -> str:
    """The fenced block right after ``<!-- guide:<marker> -->`` in docs/install.md."""
    return marked_block(ROOT / "docs" / "install.md", f"guide:{marker}")


@pytest.fixture
def guide_services() -> Iterator[dict[str, str]]:
    """A database of its own on the test's PostgreSQL, and the gate's own Redis database."""
    db = settings.DATABASES["default"]
    name = f"guide_{uuid.uuid4().hex[:8]}"
    admin = dict(host=db.get("HOST") or "127.0.0.1", port=db.get("PORT") or 5432, user=db.get("USER") or "postgres",
                 password=db.get("PASSWORD") or None, dbname="postgres", autocommit=True)
    with psycopg.connect(**admin) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    # The gate's own Redis database (tests.settings), never a fixed one another user of the
    # server may have: the guide's project keeps its cache and its broker keys there.
    cache_url = broker_url = settings.CACHES["default"]["LOCATION"]
    redis.Redis.from_url(cache_url).flushdb()
    yield {"PGDATABASE": name, "PGHOST": admin["host"], "PGPORT": str(admin["port"]), "PGUSER": admin["user"],
           "PGPASSWORD": admin["password"] or "", "REDIS_URL": cache_url, "BROKER_URL": broker_url}
    redis.Redis.from_url(cache_url).flushdb()
    with psycopg.connect(**admin) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_the_install_guide_works_in_a_fresh_project(tmp_path: Path, guide_services: dict[str, str]) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"),
                    str(ROOT)], check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("django_backend_composition-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {key: value for key, value in os.environ.items()
           if key not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "PYTHONPATH", "VIRTUAL_ENV")}
    env.update(guide_services, PATH=f"{venv / 'bin'}:{env['PATH']}",
               PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "metrics" / "not-there-yet"))

    def sh(script: str, cwd: Path = tmp_path, timeout: float = 600) -> str:
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env,
                                capture_output=True, text=True, timeout=timeout)
        assert result.returncode == 0, f"{script}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        return result.stdout

    # As written, but from this wheel rather than a clone next to the project.
    install = guide_block("install")
    assert "pip install ./django-backend-composition " in install, "the guide's install line changed: follow it here"
    sh(install.replace("./django-backend-composition ", f"{wheel} ", 1)
       .replace("pip install", "python -m pip install -q", 1))
    sh("django-admin startproject mysite")
    project = tmp_path / "mysite"
    settings_py = project / "mysite" / "settings.py"
    settings_py.write_text(settings_py.read_text() + "\n" + guide_block("settings"))
    urls_py = project / "mysite" / "urls.py"
    urls_py.write_text(urls_py.read_text() + "\n" + guide_block("urls"))

    # The user's own app, with a job whose effect a unique constraint makes happen once.
    sh("python manage.py startapp shop", cwd=project)
    (project / "shop" / "models.py").write_text(textwrap.dedent('''
        from django.db import models

        class Delivery(models.Model):
            token = models.CharField(max_length=40, unique=True)
    '''))
    (project / "shop" / "jobs.py").write_text(textwrap.dedent('''
        from composition.jobs import job
        from shop.models import Delivery

        @job(queue="default", idempotent=True)
        def deliver(token: str) -> None:
            Delivery.objects.get_or_create(token=token)
    '''))
    settings_py.write_text(settings_py.read_text() + '\nINSTALLED_APPS += ["shop"]\n')
    sh("python manage.py makemigrations shop -v 0", cwd=project)

    run = guide_block("run")
    before_workers = run[: run.index("python manage.py runworkers")].replace(
        "export PROMETHEUS_MULTIPROC_DIR=/tmp/app-metrics", "")  # the test's own folder, still missing
    out = sh(before_workers, cwd=project)
    assert "readiness: ok" in out, out
    assert Path(env["PROMETHEUS_MULTIPROC_DIR"]).is_dir()  # made by composition, at import

    (project / "publish_one.py").write_text(textwrap.dedent('''
        import django, os
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
        django.setup()
        from django.db import transaction
        from composition.outbox import publish
        from shop.jobs import deliver
        with transaction.atomic():
            publish(deliver, {"token": "guide-1"})
        try:
            publish(deliver, {"tokn": "guide-2"})  # a wrong payload is refused at publish
        except Exception as exc:
            print("refused:", type(exc).__name__)
        from django.test import Client
        client = Client(HTTP_HOST="localhost")
        assert client.get("/healthz").status_code == 200
        metrics = client.get("/metrics").content.decode()
        print("http metrics:", "django_http_requests_total_by_method_total" in metrics)
    '''))
    log = (tmp_path / "runworkers.log").open("wb")
    workers = subprocess.Popen([str(venv / "bin" / "python"), "manage.py", "runworkers", "--threads", "2",
                                "--shutdown-timeout", "10"], cwd=project, env=env, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
        published = sh("python publish_one.py", cwd=project)
        assert "refused: PayloadDoesNotFitError" in published, published
        assert "http metrics: True" in published, published  # the guide's middleware counts requests
        deadline = time.monotonic() + 60
        query = "SELECT count(*) FROM shop_delivery WHERE token = 'guide-1'"
        connect = dict(host=env["PGHOST"], port=env["PGPORT"], user=env["PGUSER"], dbname=env["PGDATABASE"],
                       password=env["PGPASSWORD"] or None)
        while True:
            with psycopg.connect(**connect) as conn:
                if conn.execute(query).fetchone() == (1,):
                    break
            assert workers.poll() is None, (tmp_path / "runworkers.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp_path / "runworkers.log").read_text()[-3000:]
            time.sleep(0.5)
        with psycopg.connect(**connect) as conn:
            rows = conn.execute("SELECT payload FROM composition_outboxmessage").fetchall()
        assert [payload for (payload,) in rows] == [{"token": "guide-1"}], "the refused payload left no row"
        os.killpg(workers.pid, signal.SIGTERM)
        assert workers.wait(30) == 0, (tmp_path / "runworkers.log").read_text()[-3000:]
    finally:
        if workers.poll() is None:
            os.killpg(workers.pid, signal.SIGKILL)
            workers.wait()
        log.close()
