"""gunicorn settings for the example project (``--config python:project.gunicorn_conf``)."""

import os

workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
threads = int(os.environ.get("WEB_THREADS", "4"))
graceful_timeout = int(os.environ.get("WEB_GRACEFUL_TIMEOUT_S", "20"))
timeout = 60
accesslog = None


def child_exit(server, worker):
    # Live gauges of a dead worker must not linger in the merged /metrics.
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
