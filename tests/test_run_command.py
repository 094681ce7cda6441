"""The README's run command on embedded servers: ready within 60 s, Ctrl-C stops it in order."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from composition.testing import free_port, http_status
from tests.browser import artifacts_dir, chrome, log_in_to_admin

ROOT = Path(__file__).resolve().parent.parent

# ./run uses the main .venv whatever interpreter runs pytest: in the matrix cell this would only
# run again on the main cell's Python and Django.
pytestmark = [pytest.mark.slow, pytest.mark.main_cell]


def _the_printed_token_works(base_url: str, log_path: Path) -> None:
    """./run prints a ready API token: with it a client creates and reads an invoice; without
    it the API answers 401."""
    import re
    import urllib.error

    tokens = re.findall(r"Bearer (bil_[A-Za-z0-9_-]+)", log_path.read_text())
    assert tokens, "no API token printed:\n" + log_path.read_text()[-3000:]
    # The README's curl lines, pasted as written (the token and the port put in).
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("With `./run` up, paste the token"):]
    block = block[block.index("```sh") + 5:]
    block = block[:block.index("```")].replace("TOKEN=bil_…", f"TOKEN={tokens[0]}")
    block = block.replace("127.0.0.1:8000", base_url.removeprefix("http://"))
    pasted = subprocess.run(["bash", "-c", block], capture_output=True, text=True, timeout=60)
    # curl -s prints each answer without a newline: one JSON document after the other.
    answers = [json.loads(doc) for doc in pasted.stdout.replace("}{", "}\n{").splitlines() if doc.strip()]
    assert [a.get("status") or a.get("code") for a in answers[:3]] == ["open", "open", None], answers
    assert answers[2]["created"] is True and answers[3]["results"][0]["status"] == "paid", answers
    assert answers[4]["code"] == "invoice_paid", answers
    headers = {"Authorization": f"Bearer {tokens[0]}", "Content-Type": "application/json"}
    body = json.dumps({"number": "RUN-1", "customer": "Ada", "amount_cents": 4200}).encode()
    request = urllib.request.Request(f"{base_url}/api/invoices", data=body, headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 201
        invoice = json.loads(response.read())
    listing = urllib.request.Request(f"{base_url}/api/invoices", headers=headers)
    with urllib.request.urlopen(listing, timeout=10) as response:
        assert [row["number"] for row in json.loads(response.read())["results"]] == ["RUN-1", "INV-1"]
    assert http_status(f"{base_url}/api/invoices/{invoice['id']}") == 401  # anonymous


def _admin_is_styled_in_a_browser(base_url: str) -> None:
    """Log in as the dev superuser, open the dead letters, and check the admin's CSS applied:
    without its static files the header has no background and the icons are giant."""
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




def test_run_command_serves_readyz_on_embedded_servers_and_ctrl_c_stops_in_reverse(tmp_path: Path) -> None:
    port = free_port()
    env = {key: value for key, value in os.environ.items()
           if key not in ("DATABASE_URL", "REDIS_URL", "BROKER_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(COMPOSITION_DATA_DIR=str(tmp_path), PORT=str(port), LOG_FORMAT="json", DRAIN_WAIT_S="3")
    log_path = tmp_path / "run.log"
    with log_path.open("wb") as log:
        # Its own process group, like a shell's foreground job: Ctrl-C reaches the whole group.
        process = subprocess.Popen(["./run"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while http_status(f"http://127.0.0.1:{port}/readyz") != 200:
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "not ready within 60 s:\n" + log_path.read_text()
            time.sleep(0.25)
        assert http_status(f"http://127.0.0.1:{port}/healthz") == 200
        # The admin is styled: its static files are collected and served (DEBUG is off).
        assert http_status(f"http://127.0.0.1:{port}/static/admin/css/base.css") == 200
        # Multiprocess metrics: the web's /metrics also shows what the worker process wrote.
        def metrics() -> bytes:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                return bytes(response.read())

        deadline = time.monotonic() + 15
        while b"composition_worker_heartbeat_timestamp_seconds " not in metrics():
            assert time.monotonic() < deadline, metrics().decode()[:3000]
            time.sleep(0.25)
        assert b"django_http_requests_total" in metrics()
        _admin_is_styled_in_a_browser(f"http://127.0.0.1:{port}")
        _the_printed_token_works(f"http://127.0.0.1:{port}", log_path)

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
    launcher = ["embedded-postgres", "embedded-valkey", "migrations", "workers", "web"]
    assert [name for name in started if name in launcher][:3] == launcher[:3]
    own_stops = [entry for entry in stopped if entry[0] in ("web", "migrations") or entry[0].startswith("embedded")]
    assert own_stops == [("web", "stopped"), ("migrations", "stopped"), ("embedded-valkey", "stopped"),
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
