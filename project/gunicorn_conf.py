"""gunicorn settings for the example project (``--config python:project.gunicorn_conf``)."""

import os

# The multiprocess metrics directory's hooks (composition.gunicorn): a config of your own imports them too.
from composition.gunicorn import child_exit, gunicorn_logger, on_starting  # noqa: F401

# gunicorn's own lines as JSON too (or console), like every other line of the project.
logger_class = gunicorn_logger(os.environ.get("LOG_FORMAT", "json"))

# gthread, refusing new connections as soon as a graceful stop begins (composition.gunicorn).
worker_class = "composition.gunicorn.ThreadWorker"
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
threads = int(os.environ.get("WEB_THREADS", "4"))
graceful_timeout = int(os.environ.get("WEB_GRACEFUL_TIMEOUT_S", "20"))
# The deployment serves behind nginx (docker/nginx.conf), which sends gunicorn whole requests only;
# these bound what a client reaching gunicorn directly (./run) can hold. An idle kept-alive
# connection waits in the worker's poller, not in a thread, and is closed after `keepalive`
# seconds; a new connection gets a thread for its first byte only briefly, and a read or write
# that stalls gives the thread back after a few seconds (composition.gunicorn.ThreadWorker).
keepalive = 2
# A file response sent with sendfile() waits for a client that stopped reading without the
# worker's stall limit: WhiteNoise's static files are written as ordinary responses instead.
sendfile = False
# A worker whose main loop stops beating (not a slow request: gthread's loop beats meanwhile) is replaced.
timeout = 60
accesslog = None
