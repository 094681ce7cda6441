"""The chaos soak (``bench/chaos.py``): idempotent and non-idempotent jobs through the outbox into
real ``runworkers`` processes, while a worker process group is SIGKILLed (every second kill aimed
at the relay mid-batch), the broker restarts once and PostgreSQL restarts once. Nothing may be
lost, no idempotent effect may happen twice, no fault may be skipped, and nothing the soak started
may outlive it. The soak's own report is printed (``pytest -s``) with how long it took.

Two sizes: the gate's (every fault once) and CI size under ``soak`` (``make soak``); each also with
every process behind a PgBouncer in transaction mode with fewer server connections than worker
threads (``--pgbouncer``), after which a client of that pooler must see what it saw before. Under
``soak`` too: the broker wiped (restarted without its data) and a second host cut off from
PostgreSQL and Redis for 30 s, besides the other faults (the gate has the short versions of both
apart: tests/scenarios/test_broker_loss.py and test_partitioned_host.py)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.helpers import ROOT, require_pgbouncer

pytestmark = pytest.mark.slow

# The gate's size: 1,200 jobs and each kind of fault once (a relay kill mid-batch, a kill
# mid-stream, a broker restart, a PostgreSQL restart), half a minute on a loaded 2-core machine.
GATE_SIZE = ["--jobs", "600", "--kills", "2", "--relay-burst", "200"]
# CI size, about 5,000 jobs and five kills: a minute or more (most of it the runworkers restarts
# and the recovery after each fault, not the jobs).
CI_SIZE = ["--jobs", "2500", "--kills", "5", "--relay-burst", "800"]
# A wipe's idempotent jobs wait out crash_effect's redelivery window (about 70 s) and a host is cut
# off for 30 s: a longer steady stream, so that work still flows after the last fault.
WIPE_AND_CUT = ["--jobs", "4000", "--kills", "3", "--relay-burst", "400", "--broker-wipes", "1",
                "--host-blackholes", "1"]
ARGS = [
    "--broker-restarts", "1", "--postgres-restarts", "1", "--threads", "4",
    "--recovery-deadline-s", "120", "--stall-s", "90",
    # Short, fixed recovery windows, whatever the defaults are: a killed group's leases and unacked
    # messages come back within seconds.
    "--overrides", '{"OUTBOX_LEASE_S": 4, "BROKER_HEARTBEAT_TIMEOUT_S": 5}',
]
# Server connections behind the pooler: fewer than ARGS' 4 threads.
POOL_SIZE = "3"
BUDGET_S = 480


def _leftovers(ports: list[str], database_urls: list[str], pooler_port: int | None = None) -> list[str]:
    """Processes still serving the soak's private ports, or still pointed at its database (directly,
    through its pooler or through a fault proxy)."""
    found = [f"{conn.pid} listening on the pooler's port {pooler_port}"
             for conn in psutil.net_connections("tcp")
             if pooler_port and conn.laddr and conn.laddr.port == pooler_port and conn.status == psutil.CONN_LISTEN]
    for process in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmdline = " ".join(process.info["cmdline"] or [])
            server = ("valkey" in cmdline or "postgres" in cmdline) and any(
                re.search(rf"\b{port}\b", cmdline) for port in ports)
            worker = "runworkers" in cmdline and process.environ().get("DATABASE_URL") in database_urls
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if server or worker:
            found.append(f"{process.pid} {cmdline[:200]}")
    return found


@pytest.mark.timeout(BUDGET_S + 120)
@pytest.mark.parametrize("size", [
    pytest.param(GATE_SIZE, id="gate"),
    pytest.param(CI_SIZE, id="ci", marks=pytest.mark.soak),
    pytest.param([*GATE_SIZE, "--pgbouncer", POOL_SIZE], id="gate-pgbouncer"),
    pytest.param([*CI_SIZE, "--pgbouncer", POOL_SIZE], id="ci-pgbouncer", marks=pytest.mark.soak),
    pytest.param(WIPE_AND_CUT, id="ci-wipe-and-cut", marks=pytest.mark.soak),
])
def test_nothing_is_lost_through_kills_and_restarts(size: list[str]) -> None:
    if "--pgbouncer" in size:
        require_pgbouncer()
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("CHAOS_") and name != "COMPOSITION_TEST_OVERRIDES"}
    started = time.monotonic()
    soak = subprocess.Popen([sys.executable, str(ROOT / "bench" / "chaos.py"), *size, *ARGS], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = soak.communicate(timeout=BUDGET_S)
    except subprocess.TimeoutExpired:
        soak.send_signal(signal.SIGTERM)  # the soak stops everything it started, then exits
        try:
            output, _ = soak.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(soak.pid, signal.SIGKILL)
            output, _ = soak.communicate()
        pytest.fail(f"the soak took longer than {BUDGET_S} s:\n{output[-6000:]}")
    took_s = time.monotonic() - started
    print(output)
    print(f"chaos soak ({' '.join(size)}) took {took_s:.0f} s")

    servers = re.search(r"private servers: (postgresql://\S+:(\d+)/\S+) redis://\S+:(\d+)/", output)
    assert servers, output[-6000:]
    pooler = re.search(r"every process through PgBouncer .*: (postgresql://\S+:(\d+)/\S+)", output)
    assert bool(pooler) is ("--pgbouncer" in size), output[-6000:]
    remote = re.search(r"host b through fault proxies: (postgresql://\S+)", output)
    assert bool(remote) is ("--host-blackholes" in size), output[-6000:]
    urls = [servers.group(1), *([pooler.group(1)] if pooler else []), *([remote.group(1)] if remote else [])]
    assert _leftovers([servers.group(2), servers.group(3)], urls, int(pooler.group(2)) if pooler else None) == []
    if pooler:
        assert re.search(r"pgbouncer: [\d,]+ transactions, .*: as before the soak", output), output[-6000:]
    assert re.search(r"lost jobs: 0 of [\d,]+ published", output), output[-6000:]
    assert "duplicate effects, idempotent: 0 jobs" in output, output[-6000:]
    assert "effects of jobs never published: 0" in output, output[-6000:]
    assert "STALLED" not in output, output[-6000:]
    caught = re.search(r"\((\d+) of (\d+) relay kills caught the relay mid-batch\)", output)
    assert caught and int(caught.group(1)) >= 1, "no kill landed with the relay mid-batch"
    if "--broker-wipes" in size:
        resent = re.search(r"broker data lost: 1 loss\(es\) detected, ([\d,]+) outbox rows sent again", output)
        assert resent and int(resent.group(1).replace(",", "")) > 0, output[-6000:]
    if "--host-blackholes" in size:
        assert re.search(r"host blackhole .*host b cut off .*; [\d,]+ jobs after it was let back", output), \
            output[-6000:]
    assert soak.returncode == 0, output[-6000:]
