"""Real processes for the billing tests: gunicorn serving the example project, JSON calls to it
over HTTP, and Django's file-based email backend, shared by every process, read back by Message-ID."""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from email import message_from_bytes
from email.message import Message
from pathlib import Path
from typing import Any

import psutil

from composition.lifecycle.processes import ProcessComponent
from composition.testing import free_port, subprocess_env, wait_until
from tests.helpers import ROOT

__all__ = ["Answer", "emails", "emails_by_message_id", "gunicorn", "mail_env", "post"]

SEPARATOR = b"\n" + b"-" * 79 + b"\n"  # what Django's file backend writes after each message


def emails(folder: Path) -> list[Message]:
    """Every message the file backend wrote under ``folder`` (several per file)."""
    found: list[Message] = []
    for path in sorted(folder.glob("*.log")) if folder.is_dir() else []:
        for chunk in path.read_bytes().split(SEPARATOR):
            if chunk.strip():
                found.append(message_from_bytes(chunk.lstrip(b"\n")))
    return found


def emails_by_message_id(folder: Path) -> Counter[str]:
    """How many messages the file backend wrote under ``folder`` with each Message-ID (unfolded:
    a long one, a reminder's, is written on a continuation line, which RFC 5322 allows)."""
    return Counter("".join(str(message["Message-ID"]).split()) for message in emails(folder))


def mail_env(mail_path: Path, **extra: str) -> dict[str, str]:
    """A child's environment (the test database) with its email written as files under ``mail_path``."""
    return subprocess_env(EMAIL_BACKEND="django.core.mail.backends.filebased.EmailBackend",
                          EMAIL_FILE_PATH=str(mail_path), **extra)


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: dict[str, Any]


def post(url: str, token: str, body: dict[str, Any]) -> Answer:
    """POST ``body`` as JSON with a bearer token; any HTTP status is an answer, not an error."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return Answer(int(response.status), dict(response.headers), json.loads(response.read() or b"{}"))
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            parsed = json.loads(raw)
        except ValueError:  # a 5xx from gunicorn itself is not JSON: keep it for the message
            parsed = {"raw": raw.decode(errors="replace")}
        return Answer(int(exc.code), dict(exc.headers), parsed)


@contextmanager
def gunicorn(env: dict[str, str], *, workers: int = 2, threads: int = 8) -> Iterator[str]:
    """gunicorn serving the example project (``env``: the child's environment) on a free port,
    ready when this yields its base URL; stopped when the block ends."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    web = ProcessComponent("web", [sys.executable, "-m", "gunicorn", "project.wsgi:application", "--config",
                                   "python:project.gunicorn_conf", "--bind", f"127.0.0.1:{port}",
                                   "--no-control-socket"],
                           env={**env, "WEB_CONCURRENCY": str(workers), "WEB_THREADS": str(threads)},
                           cwd=str(ROOT), ready_url=f"{base}/readyz")
    try:
        web.start()  # inside: a server that never got ready is stopped too
        assert web.process is not None
        _wait_every_worker_accepts(web.process.pid, workers, port)
        yield base
    finally:
        web.stop(20)


def _wait_every_worker_accepts(master_pid: int, workers: int, port: int) -> None:
    """Until each of the master's ``workers`` has accepted a connection: a worker accepts once it
    has loaded the app, and the ready check may have been answered by the first one alone, which
    would then take every connection a test opens at once."""
    master = psutil.Process(master_pid)
    accepted: set[int] = set()

    def every_worker_accepted() -> bool:
        probes = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(2 * workers)]
        try:
            ours = {probe.getsockname()[1] for probe in probes}
            time.sleep(0.05)  # for the workers to accept them
            for worker in master.children():
                with contextlib.suppress(psutil.Error):
                    if any(connection.raddr and connection.raddr.port in ours
                           for connection in worker.net_connections(kind="tcp")):
                        accepted.add(worker.pid)
        finally:
            for probe in probes:
                probe.close()
        return len(accepted) >= workers

    wait_until(every_worker_accepted, 30, interval_s=0.05,
               message=f"not every one of the {workers} gunicorn workers accepted a connection")
