"""The README's run command on embedded servers: ready within 60 s, its tour works as written,
Ctrl-C stops it in order."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from composition.testing import free_port, http_status
from tests.browser import artifacts_dir, chrome, log_in_to_admin, wait_for
from tests.helpers import ROOT, marked_block

# ./run uses the main .venv whatever interpreter runs pytest: in the matrix cell this would only
# run again on the main cell's Python and Django.
pytestmark = [pytest.mark.slow, pytest.mark.main_cell]


README = ROOT / "README.md"


def _the_readme_tour_works(base_url: str, log_path: Path, shell: dict[str, str], data: Path) -> None:
    """The README's tour, pasted into a second terminal as written (the printed token and this
    run's port put in), with the admin steps done in a browser: an invoice paid, its receipt
    job run and logged, a job dead-lettered, replayed from the admin, and the counts on
    /metrics. Then the token's other answers: without it the API says 401."""
    # Printed with "billing system up", once the workers' ready file is there too: the web's
    # /readyz and the workers' first heartbeat, which the caller waited for, can come a moment
    # before (the worker threads start last, then the file is written and seen).
    deadline = time.monotonic() + 30
    while not (tokens := re.findall(r"Bearer (bil_[A-Za-z0-9_-]+)", log_path.read_text())):
        assert time.monotonic() < deadline, "no API token printed:\n" + log_path.read_text()[-3000:]
        time.sleep(0.25)
    token = tokens[0]

    def paste(marker: str, lines: slice = slice(None)) -> str:
        block = marked_block(README, f"tour:{marker}").replace("TOKEN=bil_…", f"TOKEN={token}")
        script = "\n".join(block.replace("127.0.0.1:8000", base_url.removeprefix("http://")).splitlines()[lines])
        # The second terminal kept the TOKEN the first block set.
        pasted = subprocess.run(["bash", "-c", script], cwd=ROOT, env={**shell, "TOKEN": token}, capture_output=True,
                                text=True, timeout=120)
        assert pasted.returncode == 0, f"{script}\n{pasted.stdout[-2000:]}\n{pasted.stderr[-2000:]}"
        return pasted.stdout

    def metrics() -> str:
        with urllib.request.urlopen(f"{base_url}/metrics", timeout=5) as response:
            return str(response.read().decode())

    def wait_for(condition: Callable[[], bool], what: Callable[[], str]) -> None:
        deadline = time.monotonic() + 30
        while not condition():
            assert time.monotonic() < deadline, f"{what()} within 30 s:\n" + log_path.read_text()[-3000:]
            time.sleep(0.25)

    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def get(path: str) -> Any:
        with urllib.request.urlopen(urllib.request.Request(f"{base_url}{path}", headers=headers), timeout=10) as r:
            return json.loads(r.read())

    # Create, read, pay, list, void. curl -s prints each answer without a newline: one JSON
    # document after the other.
    out = paste("pay")
    answers = [json.loads(doc) for doc in out.replace("}{", "}\n{").splitlines() if doc.strip()]
    assert [a.get("status") or a.get("code") for a in answers[:3]] == ["open", "open", None], answers
    assert answers[2]["created"] is True and answers[3]["results"][0]["status"] == "paid", answers
    assert answers[4]["code"] == "invoice_paid", answers

    # 1 and 2: the excerpt's transaction published the receipt job; it ran, said so in the log
    # under the request's id, and emailed the receipt.
    wait_for(lambda: get("/api/invoices/1")["receipt"] is not None, lambda: "no receipt")
    status, brace, document = paste("watch").partition("{")
    assert "pending: 0" in status.splitlines(), status  # outbox status: nothing left behind
    invoice = json.loads(brace + document)
    assert invoice["receipt"]["number"] == "R-INV-1", invoice
    records = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    paid = next(r for r in records if r.get("event") == "invoice paid")
    written = next(r for r in records if r.get("event") == "payment receipt written")
    assert written["request_id"] == paid["request_id"] and written["attempt"] == 1 and written["job_id"], written
    assert any("ada@example.com" in mail.read_text() for mail in (data / "mail").iterdir())

    # 3: a job that fails for good is a dead letter.
    dead = 'composition_dead_letters_total{actor="send_payment_receipt"}'
    paste("fail", slice(0, 1))
    wait_for(lambda: f"{dead} 1.0" in metrics(), lambda: "no dead letter")
    listed = paste("fail", slice(1, None))
    assert "PermanentError" in listed and "1 dead letter(s)" in listed, listed

    # 4: replayed from the admin, as the tour clicks it.
    _replay_in_the_admin(base_url)

    # 5: the counts, once the replay has failed again: what the README shows, line for line.
    expected = sorted(marked_block(README, "tour:metrics-output").splitlines())
    shown: list[str] = []

    def counted() -> bool:
        shown[:] = sorted(line for line in paste("metrics").splitlines() if "composition_outbox_relay" not in line)
        return shown == expected

    wait_for(counted, lambda: f"/metrics did not show {expected} (last: {shown})")

    body = json.dumps({"number": "RUN-1", "customer": "Ada", "amount_cents": 4200}).encode()
    request = urllib.request.Request(f"{base_url}/api/invoices", data=body, headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 201
        created = json.loads(response.read())
    assert [row["number"] for row in get("/api/invoices")["results"]] == ["RUN-1", "INV-1"]
    assert http_status(f"{base_url}/api/invoices/{created['id']}") == 401  # anonymous


def _replay_in_the_admin(base_url: str) -> None:
    """Log in as the dev superuser, open the dead letters (styled: without its static files the
    header has no background and the icons are giant), open the one letter, Replay…, confirm."""
    from selenium.webdriver.common.by import By

    shots = artifacts_dir("run_admin")
    with chrome() as driver:
        log_in_to_admin(driver, base_url, "admin", "admin")
        driver.save_screenshot(str(shots / "admin-index.png"))
        driver.get(f"{base_url}/admin/composition/deadletter/")
        driver.save_screenshot(str(shots / "dead-letters.png"))
        header = driver.find_element(By.ID, "header")
        assert header.value_of_css_property("background-color") not in ("rgba(0, 0, 0, 0)", "transparent")
        assert driver.execute_script("return document.styleSheets.length") >= 2
        # The content starts near the top (unstyled, it sits below a screen of bare links).
        assert driver.find_element(By.ID, "content").location["y"] < 300
        (letter,) = driver.find_elements(By.CSS_SELECTOR, "#result_list tbody tr th a")
        letter.click()
        # Each click only starts loading the next page: wait for what it leads to.
        wait_for(driver, "form.dead-letter-action button", "Replay…").click()
        wait_for(driver, "input[type=submit][value^='Yes, replay']").click()
        wait_for(driver, "ul.messagelist", "Replayed")
        driver.save_screenshot(str(shots / "replayed.png"))
        notes = [note.text for note in driver.find_elements(By.CSS_SELECTOR, "ul.messagelist li")]
        assert notes == ["Replayed 1 dead letter(s)."], notes


# Records the subprocesses a Python process starts (its audit events), for counting what ./run
# starts before its web server: put on the PYTHONPATH of the run under test.
SUBPROCESS_AUDIT = """
import json, os, sys

def _record(event, args):
    if event == "subprocess.Popen":
        with open(os.environ["SUBPROCESS_AUDIT_LOG"], "a") as log:
            argv = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
            log.write(json.dumps({"pid": os.getpid(), "argv": [str(a) for a in argv]}) + "\\n")

sys.addaudithook(_record)
"""


def _start_run(env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as log:
        # Its own process group, like a shell's foreground job: Ctrl-C reaches the whole group.
        return subprocess.Popen(["./run"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _wait_ready(process: subprocess.Popen[bytes], port: int, log_path: Path) -> None:
    deadline = time.monotonic() + 60
    while http_status(f"http://127.0.0.1:{port}/readyz") != 200:
        assert process.poll() is None, log_path.read_text()
        assert time.monotonic() < deadline, "not ready within 60 s:\n" + log_path.read_text()
        time.sleep(0.25)


def _a_second_run_beside_keeps_to_itself(env: dict[str, str], port: int, data: Path) -> None:
    """Another ./run on another port, sharing the data directory: each one's draining mark and
    gunicorn control socket are its own. Draining one (``PORT=N ./manage.py drain``, pasted as
    docs/development.md has it) flips only its /readyz; stopping the other leaves its control socket."""
    other = free_port()
    log_path = data / "run-other.log"
    process = _start_run({**env, "PORT": str(other)}, log_path)
    try:
        _wait_ready(process, other, log_path)
        assert (data / f"gunicorn-{port}.ctl").exists() and (data / f"gunicorn-{other}.ctl").exists()
        shell = {key: value for key, value in env.items() if key not in ("VIRTUAL_ENV", "SUBPROCESS_AUDIT_LOG")}
        pasted = marked_block(ROOT / "docs" / "development.md", "run:drain").replace("PORT=8000", f"PORT={port}")
        drain = subprocess.run(["bash", "-c", pasted], cwd=ROOT, env=shell,
                               capture_output=True, text=True, timeout=60)
        assert drain.returncode == 0, drain.stderr[-2000:]
        assert (http_status(f"http://127.0.0.1:{port}/readyz"), http_status(f"http://127.0.0.1:{other}/readyz")) \
            == (503, 200)
        subprocess.run(["bash", "-c", f"PORT={port} ./manage.py drain --clear"], cwd=ROOT, env=shell, check=True,
                       capture_output=True, timeout=60)
        assert http_status(f"http://127.0.0.1:{port}/readyz") == 200
        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(60) == 0, log_path.read_text()[-3000:]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert (data / f"gunicorn-{port}.ctl").exists(), "stopping one ./run removed another's control socket"
    assert http_status(f"http://127.0.0.1:{port}/readyz") == 200


def _at_most_one_manage_py_before_web(audit_log: Path, supervisor: int) -> None:
    started = [json.loads(line)["argv"] for line in audit_log.read_text().splitlines()
               if json.loads(line)["pid"] == supervisor]
    web = next(i for i, argv in enumerate(started) if "gunicorn" in argv)
    # Start-up steps, that is: the workers are a component of their own, running beside web.
    steps = [argv for argv in started[:web] if any(arg.endswith("manage.py") for arg in argv)
             and "runworkers" not in argv]
    assert len(steps) <= 1, steps


def test_run_command_serves_readyz_on_embedded_servers_and_ctrl_c_stops_in_reverse(tmp_path: Path) -> None:
    port = free_port()
    audit = tmp_path / "audit"
    audit.mkdir()
    (audit / "sitecustomize.py").write_text(SUBPROCESS_AUDIT)
    env = {key: value for key, value in os.environ.items()
           if key not in ("DATABASE_URL", "REDIS_URL", "BROKER_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(COMPOSITION_DATA_DIR=str(tmp_path), PORT=str(port), LOG_FORMAT="json", DRAIN_WAIT_S="3")
    log_path = tmp_path / "run.log"
    process = _start_run({**env, "PYTHONPATH": str(audit), "SUBPROCESS_AUDIT_LOG": str(tmp_path / "audit.log")},
                         log_path)
    try:
        _wait_ready(process, port, log_path)
        _at_most_one_manage_py_before_web(tmp_path / "audit.log", process.pid)
        assert http_status(f"http://127.0.0.1:{port}/healthz") == 200
        # The first URL it prints, and the admin's "View site" link, lead somewhere.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as response:
            assert b'href="/admin/"' in response.read()
        # The admin is styled: its static files are collected and served (DEBUG is off).
        assert http_status(f"http://127.0.0.1:{port}/static/admin/css/base.css") == 200
        # Multiprocess metrics: the web's /metrics also shows what the worker process wrote.
        def metrics() -> bytes:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                return bytes(response.read())

        deadline = time.monotonic() + 15
        while b'composition_worker_heartbeat_timestamp_seconds{role="worker"} ' not in metrics():
            assert time.monotonic() < deadline, metrics().decode()[:3000]
            time.sleep(0.25)
        assert b"django_http_requests_total" in metrics()
        shell = {key: value for key, value in env.items() if key != "VIRTUAL_ENV"}
        _the_readme_tour_works(f"http://127.0.0.1:{port}", log_path, shell, tmp_path)
        _a_second_run_beside_keeps_to_itself(env, port, tmp_path)
        os.killpg(process.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        # The pre-stop step: draining is announced while gunicorn still answers.
        deadline = time.monotonic() + 10
        while (status := http_status(f"http://127.0.0.1:{port}/readyz")) == 200:
            assert time.monotonic() < deadline, "/readyz never answered draining"
            time.sleep(0.1)
        assert status == 503, status
        code = process.wait(60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    output = log_path.read_text()
    assert code == 0, output
    # Its draining mark is its port's, and gone once it stopped: another ./run sharing the data
    # directory, or the next one, does not start out (or turn) draining.
    assert not list(tmp_path.glob("*.draining")), "a drain mark outlived the run"
    assert "using embedded services" not in output  # the launcher owns them; children reuse
    started, stopped = [], []
    for line in output.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("logger") != "composition.system":
            continue
        if record["event"] == "component started":
            started.append(record["component"])
        elif record["event"] in ("component stopped", "component did not stop cleanly"):
            stopped.append((record["component"], record["status"]))
    # The launcher's own components, then the worker process's (interleaved lines are filtered
    # by the launcher's names).
    launcher = ["embedded-postgres", "embedded-valkey", "setup", "workers", "web"]
    assert [name for name in started if name in launcher][:3] == launcher[:3]
    own_stops = [entry for entry in stopped if entry[0] in ("web", "setup") or entry[0].startswith("embedded")]
    assert own_stops == [("web", "stopped"), ("setup", "stopped"), ("embedded-valkey", "stopped"),
                         ("embedded-postgres", "stopped")], output
    assert stopped[-2:] == [("embedded-valkey", "stopped"), ("embedded-postgres", "stopped")]


def test_a_second_run_on_a_taken_port_refuses_before_starting_anything(tmp_path: Path) -> None:
    # A second ./run would attach to the first one's embedded servers and replace its API token.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {key: value for key, value in os.environ.items() if key not in ("DATABASE_URL", "REDIS_URL")}
        env.update(COMPOSITION_DATA_DIR=str(tmp_path), PORT=str(port))
        began = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "project.run"], env=env, capture_output=True, text=True,
                              timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"127.0.0.1:{port} is in use" in done.stderr and f"PORT={port + 1} ./run" in done.stderr
    assert time.monotonic() - began < 10
    assert not any(tmp_path.iterdir()), "nothing may start: no embedded server, no data"


@contextmanager
def _on_a_fresh_database(tmp_path: Path, broker_url: str) -> Iterator[dict[str, str]]:
    """./run's environment on a database of its own (dropped after), this test run's Redis for its
    cache and ``broker_url`` for its broker, on a free port; JSON logs."""
    import psycopg
    from django.conf import settings

    db = settings.DATABASES["default"]
    admin = dict(host=db.get("HOST") or "127.0.0.1", port=db.get("PORT") or 5432, user=db.get("USER") or "postgres",
                 password=db.get("PASSWORD") or None, dbname="postgres", autocommit=True)
    name = f"run_{os.getpid()}_{free_port()}"
    with psycopg.connect(**admin) as conn:  # type: ignore[arg-type]
        conn.execute(f'CREATE DATABASE "{name}"')
    env = {key: value for key, value in os.environ.items() if key not in ("DJANGO_SETTINGS_MODULE",)}
    auth = admin["user"] + (f":{admin['password']}" if admin["password"] else "")
    env.update(COMPOSITION_DATA_DIR=str(tmp_path), PORT=str(free_port()), LOG_FORMAT="json",
               DATABASE_URL=f"postgresql://{auth}@{admin['host']}:{admin['port']}/{name}",
               REDIS_URL=settings.CACHES["default"]["LOCATION"], BROKER_URL=broker_url)
    try:
        yield env
    finally:
        with psycopg.connect(**admin) as conn:  # type: ignore[arg-type]
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _stopped(process: subprocess.Popen[bytes], wait_s: float) -> int:
    """``process``'s exit code once it ends, within ``wait_s``; killed with its group if not."""
    try:
        return process.wait(wait_s)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_run_says_it_could_not_start_when_the_workers_cannot_and_never_that_it_is_up(tmp_path: Path) -> None:
    # The workers were up once launched: ./run printed "billing system up" and the API token a
    # second after they had failed, then stopped everything as a component that died.
    with _on_a_fresh_database(tmp_path, broker_url=f"redis://127.0.0.1:{free_port()}/0") as env:
        log_path = tmp_path / "run.log"
        code = _stopped(_start_run(env, log_path), 120)
    port = int(env["PORT"])
    output = log_path.read_text()
    assert code == 1, output[-3000:]
    assert "billing system up" not in output and "Bearer" not in output, output[-3000:]
    assert re.search(r"could not start: .*workers-ready.*workers: exited with code 1 before it was ready", output), \
        output[-3000:]
    assert http_status(f"http://127.0.0.1:{port}/healthz") == 0  # the web it started is gone
    assert not list(tmp_path.glob("*.ready"))


def test_a_terminal_s_ctrl_c_during_the_set_up_lets_it_finish_and_stops_cleanly(tmp_path: Path) -> None:
    # The set-up (migrate, collectstatic) ran in the terminal's process group: Ctrl-C there
    # broke it with a KeyboardInterrupt traceback and ./run exited 1.
    import psutil
    from django.conf import settings

    with _on_a_fresh_database(tmp_path, broker_url=settings.COMPOSITION["BROKER_URL"]) as env:
        log_path = tmp_path / "run.log"
        process = _start_run(env, log_path)
        deadline = time.monotonic() + 60
        while process.poll() is None and not any(
                "dev_setup" in " ".join(child.cmdline()) for child in psutil.Process(process.pid).children(True)):
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.05)
        os.killpg(process.pid, signal.SIGINT)  # the whole foreground group, as a terminal does
        code = _stopped(process, 120)
    output = log_path.read_text()
    assert code == 0, output[-3000:]
    assert "stop requested during start-up" in output and "Traceback" not in output, output[-3000:]
