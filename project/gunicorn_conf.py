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
timeout = 60
accesslog = None
