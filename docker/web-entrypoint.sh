#!/bin/sh
# The web container's command: gunicorn with the pre-stop step that compose lacks. On SIGTERM
# it first marks the host draining (/readyz answers 503 "draining" for DRAIN_WAIT_S, while
# gunicorn still serves), then passes SIGTERM on and waits for gunicorn's graceful stop.
# Under Kubernetes, a preStop exec of `python manage.py drain` does the same with plain gunicorn.
set -eu
python manage.py drain --clear >/dev/null  # a mark left by an earlier life of this container
gunicorn project.wsgi:application --config python:project.gunicorn_conf --bind "0.0.0.0:${PORT:-8000}" &
pid=$!
trap 'python manage.py drain; kill -TERM "$pid"' TERM INT
wait "$pid" || true  # returns when the trap has run (or gunicorn exited by itself)
wait "$pid"
