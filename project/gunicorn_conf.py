"""gunicorn settings for the example project (``--config python:project.gunicorn_conf``)."""

import os

workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
threads = int(os.environ.get("WEB_THREADS", "4"))
graceful_timeout = int(os.environ.get("WEB_GRACEFUL_TIMEOUT_S", "20"))
timeout = 60
accesslog = None


def on_starting(server):
    # Files left by processes of an earlier run that no longer run: into the archive, once.
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        from composition.prometheus import archive_dead_processes

        os.makedirs(directory, exist_ok=True)
        try:
            archive_dead_processes(directory)
        except Exception as exc:  # serving goes on; the leftovers still count, only unmerged
            server.log.error("could not archive leftover metrics files: %s", exc)


def child_exit(server, worker):
    # The arbiter has reaped the worker: its counters and histograms go into the archive (totals
    # never go down, scrapes stay fast) and its live gauges go (as mark_process_dead does).
    from composition.prometheus.archive import archive_reaped_child

    try:
        archive_reaped_child(worker.pid)
    except Exception as exc:  # the arbiter goes on; the files are archived at the next start
        server.log.error("could not archive the metrics of worker %s: %s", worker.pid, exc)
