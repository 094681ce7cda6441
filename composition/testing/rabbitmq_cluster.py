"""A throwaway RabbitMQ cluster of N nodes on this machine, for failover tests.

Every node runs Debian's RabbitMQ from ``/usr/lib/rabbitmq/bin`` as a direct child of the test
process, with its configuration, data, logs, Erlang cookie and port mapper (epmd) in one temporary
directory. The invariant a changer must not break: nothing here may reach the machine's own node
(``rabbit@localhost``): its environment file, its cookie, its epmd or a CLI call without ``-n``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from composition.testing.rabbitmq_layout import RABBITMQ_BIN_DIR, ClusterLayout
from composition.testing.servers import become, server_user
from composition.testing.waiting import free_port

if TYPE_CHECKING:
    import psutil

__all__ = ["ThrowawayRabbitCluster", "throwaway_rabbit_cluster"]

EPMD = "epmd"


class ThrowawayRabbitCluster:
    """A private RabbitMQ cluster of ``nodes`` nodes on loopback, node 1 the one the others join.

    ``start()`` starts every node and clusters them (``join_cluster`` to node 1), waiting until
    node 1 lists them all running; ``urls`` are one AMQP URL per node (guest/guest, loopback).
    ``stop_node(i)`` stops node ``i`` (0-based) gracefully, keeping its data; ``start_node(i)``
    starts it again on the same data and ports, and it rejoins by itself. ``leader_of(queue)`` is
    the index of the node leading a quorum queue. ``close()`` stops every node, kills what did not
    stop, and removes the directory, even when a node failed.

    The nodes register with an epmd of their own on a free port (``ERL_EPMD_PORT``), never the
    shared one, and read ``rabbitmq-env.conf`` from the temporary directory, never ``/etc``.
    Started from a thread that ends, the nodes end with it (they die with their parent thread).
    """

    def __init__(self, nodes: int = 3, *, name_prefix: str = "ctest") -> None:
        if nodes < 1:
            raise ValueError(f"a cluster needs at least one node, got {nodes}")
        server = RABBITMQ_BIN_DIR / "rabbitmq-server"
        epmd = shutil.which(EPMD)
        if not server.exists() or epmd is None:
            raise RuntimeError("ThrowawayRabbitCluster needs Debian's rabbitmq-server (and Erlang's epmd): "
                               "apt-get install rabbitmq-server")
        self._server = server
        self._epmd_binary = epmd
        self._dir = Path(tempfile.mkdtemp(prefix="throwaway-rabbit-cluster-"))
        token = secrets.token_hex(4)
        self.node_names = [f"{name_prefix}{index + 1}-{token}@localhost" for index in range(nodes)]
        # Fixed once: a node started again comes back where its clients and peers expect it. The
        # distribution port is chosen too, as the default (AMQP port + 20000) overflows for a
        # high free port.
        ports = _distinct_free_ports(2 * nodes + 1)
        self.ports, self.dist_ports, self.epmd_port = ports[:nodes], ports[nodes:-1], ports[-1]
        self._user = server_user()
        self._epmd: subprocess.Popen[bytes] | None = None
        self._processes: list[subprocess.Popen[bytes] | None] = [None] * nodes
        self.layout = ClusterLayout(self._dir, self.node_names, self.ports, self.dist_ports, self.epmd_port)
        self.layout.write(self._user)

    @property
    def directory(self) -> Path:
        return self._dir

    @property
    def urls(self) -> list[str]:
        return [f"amqp://guest:guest@127.0.0.1:{port}/%2F" for port in self.ports]

    def log(self, index: int) -> str:
        """Node ``index``'s RabbitMQ log, then what its VM wrote to stdout and stderr."""
        node_dir = self.layout.node_dir(index)
        parts = [path.read_text(errors="replace") for path in (
            node_dir / "log" / f"{self.node_names[index]}.log", node_dir / "stdout.log") if path.exists()]
        return "\n".join(parts)

    def running(self, index: int) -> bool:
        process = self._processes[index]
        return process is not None and process.poll() is None

    def start(self, timeout_s: float = 120.0) -> ThrowawayRabbitCluster:
        """Start every node, join nodes 2..N to node 1 and wait until node 1 lists all N running.
        On any failure the cluster is closed and a RuntimeError raised with the nodes' logs."""
        try:
            deadline = time.monotonic() + timeout_s
            self._start_epmd()
            # Side by side: each boot is mostly waiting on its own single scheduler.
            for index in range(len(self.node_names)):
                self._spawn(index)
            for index in range(len(self.node_names)):
                self._await_startup(index, deadline)
            first = self.node_names[0]
            for index in range(1, len(self.node_names)):
                self.ctl(index, "stop_app", timeout_s=deadline - time.monotonic())
                self.ctl(index, "join_cluster", first, timeout_s=deadline - time.monotonic())
                self.ctl(index, "start_app", timeout_s=deadline - time.monotonic())
            self.wait_running(len(self.node_names), timeout_s=deadline - time.monotonic())
        except Exception as exc:
            logs = "\n".join(f"--- {name}:\n{self.log(index)[-3000:]}" for index, name in enumerate(self.node_names))
            self.close()
            raise RuntimeError(f"the cluster did not start: {exc}\n{logs}") from exc
        except BaseException:
            self.close()
            raise
        return self

    def stop_node(self, index: int, timeout_s: float = 60.0) -> None:
        """Stop node ``index`` gracefully (``rabbitmqctl stop``); its data stays for start_node."""
        process = self._processes[index]
        if process is None or process.poll() is not None:
            return
        self.ctl(index, "stop", timeout_s=timeout_s)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._kill_group(process)

    def start_node(self, index: int, timeout_s: float = 90.0) -> None:
        """Start node ``index`` again on its data and ports; it rejoins the cluster by itself.
        Returns once it has booted (the caller waits for the cluster with ``wait_running``)."""
        if self.running(index):
            return
        self._spawn(index)
        self._await_startup(index, time.monotonic() + timeout_s)

    def ctl(self, index: int, *args: str, tool: str = "rabbitmqctl", timeout_s: float = 60.0) -> str:
        """Run ``tool -n <node index> args`` (rabbitmqctl, rabbitmq-queues, rabbitmq-diagnostics)
        as the cluster's user with its cookie; its stdout. Raises RuntimeError when it fails."""
        return self._run_cli(tool, self.node_names[index], *args, timeout_s=timeout_s)

    def running_nodes(self, index: int | None = None) -> list[str]:
        """The running nodes of the cluster as node ``index`` (the first running one by default)
        sees them (``cluster_status``)."""
        asked = self._a_running_node() if index is None else index
        status = json.loads(self.ctl(asked, "cluster_status", "--formatter", "json"))
        return sorted(status["running_nodes"])

    def wait_running(self, count: int, timeout_s: float = 60.0) -> None:
        """Wait until a running node lists ``count`` nodes running; AssertionError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            seen = self.running_nodes()
            if len(seen) == count:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{count} nodes running wanted, cluster_status lists {seen}")
            time.sleep(0.5)

    def leader_of(self, queue_name: str, vhost: str = "/") -> int:
        """The index of the node leading quorum queue ``queue_name`` (``rabbitmq-queues
        quorum_status``, asked of a running node). Raises LookupError when no member leads."""
        table = self.ctl(self._a_running_node(), "quorum_status", queue_name, "--vhost", vhost,
                         "--formatter", "json", tool="rabbitmq-queues")
        for member in json.loads(table):
            if str(member.get("Raft State", "")).lower() == "leader":
                return self.node_names.index(member["Node Name"])
        raise LookupError(f"no leader for quorum queue {queue_name!r}: {table}")

    def processes(self) -> list[psutil.Process]:
        """The live processes of this cluster (psutil.Process): every one whose command line or
        HOME names its directory (the VMs, their port programs, its epmd, a CLI call)."""
        import psutil

        found = []
        for process in psutil.process_iter(["cmdline", "environ"]):
            with contextlib.suppress(psutil.Error):
                cmdline = " ".join(process.info["cmdline"] or ())
                home = (process.info["environ"] or {}).get("HOME")
                if str(self._dir) in cmdline or home == str(self._dir) or any(
                        name in cmdline for name in self.node_names):
                    found.append(process)
        return found

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop every node (SIGTERM: a graceful shutdown), then its epmd; kill whatever is still
        running after ``timeout_s``; remove the directory. Never raises for a node that failed."""
        import psutil

        running = [process for process in self._processes if process is not None and process.poll() is None]
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
        deadline = time.monotonic() + timeout_s
        for process in running:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._kill_group(process)
        # The VMs' port programs (erl_child_setup, inet_gethost) leave with their VM; the last
        # sweep takes anything that did not, and a CLI call a timeout left behind.
        if self._epmd is not None and self._epmd.poll() is None:
            self._epmd.terminate()
            try:
                self._epmd.wait(5)
            except subprocess.TimeoutExpired:
                self._epmd.kill()
                self._epmd.wait()
        leftovers = self.processes()
        for leftover in leftovers:
            with contextlib.suppress(psutil.Error):
                leftover.kill()
        psutil.wait_procs(leftovers, timeout=5)
        shutil.rmtree(self._dir, ignore_errors=True)

    def _start_epmd(self, timeout_s: float = 10.0) -> None:
        # Not daemonised: it is our child, so close() can stop it and it dies with the test.
        self._epmd = subprocess.Popen(
            [self._epmd_binary, "-port", str(self.epmd_port), "-address", "127.0.0.1"],
            env=self.layout.common_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=become(self._user), cwd=self._dir)
        self._wait_listening(self.epmd_port, self._epmd, time.monotonic() + timeout_s, "epmd")

    def _spawn(self, index: int) -> None:
        node_dir = self.layout.node_dir(index)
        output = (node_dir / "stdout.log").open("ab")
        self._processes[index] = subprocess.Popen(
            [str(self._server)], env=self.layout.node_env(index), stdin=subprocess.DEVNULL, stdout=output,
            stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=become(self._user), cwd=node_dir)
        output.close()

    def _await_startup(self, index: int, deadline: float) -> None:
        process = self._processes[index]
        assert process is not None
        # The AMQP listener opens near the end of the boot, so the (costly) CLI call is made once.
        self._wait_listening(self.ports[index], process, deadline, self.node_names[index])
        self.ctl(index, "await_startup", timeout_s=max(1.0, deadline - time.monotonic()))

    def _wait_listening(self, port: int, process: subprocess.Popen[bytes], deadline: float, what: str) -> None:
        while True:
            if process.poll() is not None:
                index = self._processes.index(process) if process in self._processes else None
                raise RuntimeError(f"{what} exited with {process.returncode}"
                                   + (f":\n{self.log(index)[-4000:]}" if index is not None else ""))
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{what} not listening on {port} in time") from None
                time.sleep(0.2)

    def _a_running_node(self) -> int:
        for index in range(len(self.node_names)):
            if self.running(index):
                return index
        raise RuntimeError("no node of the cluster is running")

    def _run_cli(self, tool: str, node: str, *args: str, timeout_s: float) -> str:
        argv: Sequence[str] = [str(RABBITMQ_BIN_DIR / tool), "-n", node, *args]
        try:
            done = subprocess.run(argv, env=self.layout.common_env(), capture_output=True, text=True,
                                  timeout=max(1.0, timeout_s), preexec_fn=become(self._user), cwd=self._dir)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"{' '.join(argv)} took over {timeout_s:.0f} s") from exc
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout}{done.stderr}")
        return done.stdout

    @staticmethod
    def _kill_group(process: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _distinct_free_ports(count: int) -> list[int]:
    """``count`` free loopback ports, all different: free_port() one after the other can hand
    out the same port twice, as each is released before the next is asked for."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


@contextmanager
def throwaway_rabbit_cluster(nodes: int = 3) -> Iterator[ThrowawayRabbitCluster]:
    cluster = ThrowawayRabbitCluster(nodes).start()
    try:
        yield cluster
    finally:
        cluster.close()

