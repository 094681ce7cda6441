#!/bin/sh
# The web container's command: gunicorn with the pre-stop step that compose lacks. On SIGTERM
# it first marks the host draining (/readyz answers 503 "draining" for DRAIN_WAIT_S, while
# gunicorn still serves), then passes SIGTERM on and waits for gunicorn's graceful stop.
# Under Kubernetes, a preStop exec of `python manage.py drain` does the same with plain gunicorn.
set -u
python manage.py drain --clear >/dev/null  # a mark left by an earlier life of this container
gunicorn project.wsgi:application --config python:project.gunicorn_conf --bind "0.0.0.0:${PORT:-8000}" &
pid=$!
stop() {
    # One stop: a signal again is the same request. This script is the container's PID 1, so
    # exiting before gunicorn would kill it, and the requests it is finishing, at once.
    trap '' TERM INT
    python manage.py drain || true
    kill -TERM "$pid" 2>/dev/null || true
}
trap stop TERM INT
# A signal ends `wait` early (its trap runs then): wait again until gunicorn itself has exited,
# and exit with its status.
status=0
while kill -0 "$pid" 2>/dev/null; do
    wait "$pid"
    status=$?
done
exit "$status"
