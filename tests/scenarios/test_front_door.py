"""The front door the deployment ships: docker/nginx.conf in front of the example's gunicorn
(project/gunicorn_conf.py), both real processes on 127.0.0.1. Slow clients (POSTs that announce
a body and send one byte, connections that say nothing), more of them than gunicorn has
threads, leave /healthz answering through the proxy, and the proxy closes them within its own
timeouts; the same clients sent to gunicorn alone starve it, which is why the proxy ships.

nginx runs as the current user with everything it writes (pid, logs, temporary files) in a
temporary folder, in its own process group, stopped with the test; the config is the shipped
file with its upstream and listen address pointed here (``_render``), nothing else changed.
"""

from __future__ import annotations

import functools
import grp
import json
import math
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from composition.lifecycle.processes import detach_and_die_with_parent
from composition.testing import free_port, http_status, subprocess_env, wait_until
from project import gunicorn_conf
from tests.browser import tool_missing
from tests.gunicorn_server import gunicorn
from tests.helpers import ROOT

pytestmark = pytest.mark.slow

SHIPPED_CONF = ROOT / "docker" / "nginx.conf"
HEALTHZ_WITHIN_S = 1.0
# Twice the example's threads (2 workers x 4): however gunicorn's workers share the connections
# out, each gets more than it has threads.
SLOW_CLIENTS = 2 * gunicorn_conf.workers * gunicorn_conf.threads
# A proxy's timer may fire this much after its configured timeout, on a busy machine.
CLOSE_MARGIN_S = 3.0


def _configured_seconds(directive: str) -> float:
    """A timeout the shipped config sets, in seconds (``client_body_timeout 10s;``)."""
    found = re.findall(rf"^\s*{directive}\s+(\d+)s;", SHIPPED_CONF.read_text(), flags=re.MULTILINE)
    assert len(found) == 1, f"expected one '{directive} <N>s;' in {SHIPPED_CONF}, found {found}"
    return float(found[0])


def _render(conf: str, *, listen_port: int, upstream_port: int, prefix: Path) -> str:
    """The shipped config, listening on 127.0.0.1:``listen_port`` and proxying to gunicorn on
    127.0.0.1:``upstream_port``, its temporary files under ``prefix`` (nginx's compiled-in
    folders need root)."""
    for old, new in (("listen 8000;", f"listen 127.0.0.1:{listen_port};"),
                     ("set $web_upstream web:8000;", f"set $web_upstream 127.0.0.1:{upstream_port};"),
                     ("http {\n", "http {\n" + "".join(f"    {kind}_temp_path {prefix / kind};\n" for kind in
                                                       ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")))):
        assert conf.count(old) == 1, f"{SHIPPED_CONF} no longer has exactly one {old!r}: update _render"
        conf = conf.replace(old, new)
    return conf


def _nginx_binary() -> str:
    found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")
    if not found:
        tool_missing("Debian's nginx is not installed (make nginx)")
    return found


def _port(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@dataclass(frozen=True)
class Front:
    base: str
    port: int
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""


@contextmanager
def nginx(upstream_port: int) -> Iterator[Front]:
    """The shipped config served by nginx on a free port until the block ends, then nginx and
    its workers are stopped (the whole process group, checked gone)."""
    binary = _nginx_binary()
    prefix = Path(tempfile.mkdtemp(prefix="front-door-nginx-"))
    port = free_port()
    conf = prefix / "nginx.conf"
    conf.write_text(_render(SHIPPED_CONF.read_text(), listen_port=port, upstream_port=upstream_port, prefix=prefix))
    directives = f"daemon off; pid {prefix / 'nginx.pid'};"
    if os.geteuid() == 0:  # root's nginx would run its workers as nobody, who cannot reach the temporary folder
        directives += f" user {pwd.getpwuid(os.geteuid()).pw_name} {grp.getgrgid(os.getegid()).gr_name};"
    log_path = prefix / "nginx.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [binary, "-p", str(prefix), "-e", str(prefix / "startup-error.log"), "-c", str(conf), "-g", directives],
            stdout=log, stderr=subprocess.STDOUT, preexec_fn=functools.partial(detach_and_die_with_parent, os.getpid()))
    front = Front(f"http://127.0.0.1:{port}", port, log_path)
    try:
        wait_until(lambda: process.poll() is not None or _accepts(port), 10, message="nginx did not listen")
        assert process.poll() is None, f"nginx exited with {process.returncode}:\n{front.log()}"
        yield front
    finally:
        try:
            os.killpg(process.pid, signal.SIGTERM)  # nginx's fast shutdown, master and workers
            process.wait(10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        if _group_alive(process.pid):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(5)
        wait_until(lambda: not _group_alive(process.pid), 5, message="nginx's workers outlived their master")
        shutil.rmtree(prefix, ignore_errors=True)


def _stalled_posts(port: int, count: int, token: str) -> list[socket.socket]:
    """Authenticated POSTs that announce a 100-byte JSON body and send its first byte only."""
    head = ("POST /api/invoices HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{")
    clients = []
    for _ in range(count):
        client = socket.create_connection(("127.0.0.1", port), timeout=5)
        client.sendall(head.encode())
        clients.append(client)
    return clients


def _idle_connections(port: int, count: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(count)]


def _healthz_seconds(base: str, timeout_s: float) -> float:
    """How long ``/healthz`` took to answer 200; infinity when it did not within ``timeout_s``."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(f"{base}/healthz", timeout=timeout_s) as response:
            response.read()
            return time.monotonic() - started if response.status == 200 else math.inf
    except OSError:  # refused, reset, timed out, or an HTTP error status
        return math.inf


def _healthz_round(base: str, requests: int = 8, timeout_s: float = 3.0) -> list[float]:
    """``requests`` concurrent /healthz calls (each on its own connection, so they reach every
    gunicorn worker), their durations in seconds."""
    with ThreadPoolExecutor(requests) as pool:
        return list(pool.map(lambda _: _healthz_seconds(base, timeout_s), range(requests)))


def _seconds_until_closed(clients: list[socket.socket], since: float, wait_s: float) -> list[float]:
    """For each client, when (seconds after ``since``) the server closed or reset it;
    infinity for one still open ``wait_s`` after ``since``."""
    closed = []
    for client in clients:
        remaining = since + wait_s - time.monotonic()
        try:
            client.settimeout(max(remaining, 0.01))
            while client.recv(4096):  # an answer before the close (nginx sends none on a timeout)
                pass
            closed.append(time.monotonic() - since)
        except ConnectionResetError:
            closed.append(time.monotonic() - since)
        except TimeoutError:
            closed.append(math.inf)
    return closed


def _close_all(clients: list[socket.socket]) -> None:
    for client in clients:
        client.close()


@pytest.mark.django_db(transaction=True)
def test_healthz_answers_through_the_proxy_within_1s_while_slow_clients_outnumber_gunicorns_threads(
        api_token: str) -> None:
    body_timeout_s = _configured_seconds("client_body_timeout")
    header_timeout_s = _configured_seconds("client_header_timeout")
    with ExitStack() as stack:
        web = stack.enter_context(gunicorn(subprocess_env(), workers=gunicorn_conf.workers,
                                           threads=gunicorn_conf.threads))
        front = stack.enter_context(nginx(_port(web)))
        opened = time.monotonic()
        stalled = _stalled_posts(front.port, SLOW_CLIENTS, api_token)
        idle = _idle_connections(front.port, SLOW_CLIENTS)
        stack.callback(_close_all, stalled + idle)
        time.sleep(0.5)  # every slow client is in, its byte sent
        latencies = [seconds for _ in range(3) for seconds in _healthz_round(front.base)]
        assert max(latencies) < HEALTHZ_WITHIN_S, (latencies, front.log())

        # The proxy, not the client, ends them: within its timeouts (the clients never give up).
        stalled_closed = _seconds_until_closed(stalled, opened, body_timeout_s + CLOSE_MARGIN_S)
        idle_closed = _seconds_until_closed(idle, opened, header_timeout_s + CLOSE_MARGIN_S)
        assert max(stalled_closed) <= body_timeout_s + CLOSE_MARGIN_S, (stalled_closed, front.log())
        assert max(idle_closed) <= header_timeout_s + CLOSE_MARGIN_S, (idle_closed, front.log())
        # And once they are gone, as while they were there.
        assert _healthz_seconds(front.base, 3.0) < HEALTHZ_WITHIN_S


@pytest.mark.django_db(transaction=True)
def test_the_same_slow_clients_at_gunicorn_alone_hold_healthz_past_1s(api_token: str) -> None:
    # The control for the test above: without the proxy the front door does not hold.
    with gunicorn(subprocess_env(), workers=gunicorn_conf.workers, threads=gunicorn_conf.threads) as web:
        port = _port(web)
        clients = _stalled_posts(port, SLOW_CLIENTS, api_token) + _idle_connections(port, SLOW_CLIENTS)
        try:
            time.sleep(0.5)
            latencies = _healthz_round(web)
        finally:
            _close_all(clients)
    assert max(latencies) > HEALTHZ_WITHIN_S, latencies


@pytest.mark.django_db(transaction=True)
def test_idle_connections_at_gunicorn_alone_wait_in_its_poller_not_in_its_threads() -> None:
    # gunicorn 27's own gthread worker keeps each for 5 s in a thread (composition.gunicorn.ThreadWorker).
    with gunicorn(subprocess_env(), workers=gunicorn_conf.workers, threads=gunicorn_conf.threads) as web:
        idle = _idle_connections(_port(web), SLOW_CLIENTS)
        try:
            time.sleep(0.5)
            latencies = _healthz_round(web)
        finally:
            _close_all(idle)
    assert max(latencies) < HEALTHZ_WITHIN_S, latencies


@pytest.mark.django_db(transaction=True)
def test_the_proxy_passes_a_request_id_on_and_leaves_metrics_to_prometheus() -> None:
    with gunicorn(subprocess_env(), workers=1, threads=2) as web, nginx(_port(web)) as front:
        request = urllib.request.Request(f"{front.base}/healthz", headers={"X-Request-ID": "front-door-1"})
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.headers["X-Request-ID"] == "front-door-1"
        with urllib.request.urlopen(f"{front.base}/healthz", timeout=5) as response:
            assert re.fullmatch(r"[0-9a-f]{32}", response.headers["X-Request-ID"]), "not nginx's $request_id"
        # Prometheus scrapes gunicorn itself; through the proxy the caller's address is the proxy's.
        assert http_status(f"{front.base}/metrics") == 404
        assert http_status(f"{web}/metrics") in (200, 401, 403)


def test_the_proxy_answers_in_json_under_api_for_a_body_over_its_limit_and_without_gunicorn() -> None:
    with nginx(free_port()) as front:  # nothing listens upstream
        too_large = urllib.request.Request(f"{front.base}/api/invoices", method="POST", data=b"{}",
                                           headers={"Content-Type": "application/json"})
        too_large.add_unredirected_header("Content-Length", str(4 * 1024 * 1024))
        answers = {}
        for name, request in (("too_large", too_large),
                              ("unavailable", urllib.request.Request(f"{front.base}/api/invoices"))):
            with pytest.raises(urllib.error.HTTPError) as error:
                urllib.request.urlopen(request, timeout=5)
            assert error.value.headers["Content-Type"] == "application/json"
            answers[name] = (error.value.code, json.loads(error.value.read())["code"])
    assert answers == {"too_large": (413, "body_too_large"), "unavailable": (503, "unavailable")}


def test_compose_publishes_the_proxy_with_this_config_and_not_gunicorn() -> None:
    yaml = pytest.importorskip("yaml")
    services = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())["services"]
    proxy, web = services["proxy"], services["web"]
    assert proxy["image"].startswith("nginx")
    assert "./nginx.conf:/etc/nginx/nginx.conf:ro" in proxy["volumes"]  # the file the tests above run
    assert proxy["ports"] == ["8000:8000"]
    assert not web.get("ports"), "gunicorn must be reached through the proxy only"
    assert "8000" in [str(port) for port in web.get("expose", [])]
