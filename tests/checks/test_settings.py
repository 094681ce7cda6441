"""Configuration mistakes are reported by ``manage.py check`` with composition ids."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.conf import settings
from django.core.checks import run_checks
from django.test import override_settings

from composition.checks import check_settings
from composition.checks.settings import check_metrics_directory
from composition.conf import DEFAULTS, conf
from composition.testing import subprocess_env
from tests.helpers import ROOT


def _ids(**composition: object) -> set[str]:
    with override_settings(COMPOSITION={**settings.COMPOSITION, **composition}):
        return {message.id for message in check_settings()}


def test_project_settings_are_clean() -> None:
    assert check_settings() == []


def test_an_unknown_key_is_named_with_the_key_it_was_meant_to_be() -> None:
    with override_settings(COMPOSITION={**settings.COMPOSITION, "BROKR_URL": "redis://x", "NOTHING_LIKE_IT": 1}):
        messages = check_settings()
    assert [message.msg for message in messages] == [
        "COMPOSITION has unknown key 'BROKR_URL'; did you mean 'BROKER_URL'?",
        "COMPOSITION has unknown key 'NOTHING_LIKE_IT'."]
    assert all(message.hint == "docs/configuration.md lists every key." for message in messages)


def test_each_mistake_has_its_own_id() -> None:
    assert _ids(BROKR_URL="redis://x") == {"composition.E002"}
    assert _ids(BROKER_URL="kafka://localhost") == {"composition.E003"}
    with override_settings(CACHES={**settings.CACHES, "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": "redis://127.0.0.1:6379/7"}}):
        assert {message.id for message in check_settings()} == {"composition.W001"}
    assert _ids(HEALTH_DEADLINE_S=0) == {"composition.E004"}
    assert _ids(SHUTDOWN_TIMEOUT_S="30") == {"composition.E004"}
    assert _ids(LIMIT_SLOT_TTL_S=0) == {"composition.E004"}
    assert _ids(LIMIT_MAX_DELAY_S=-1) == {"composition.E004"}
    assert _ids(WORKER_QUEUES="critical=4,bulk") == {"composition.E012"}
    assert _ids(WORKER_QUEUES=["critical=4", "bulk=1"]) == set()
    assert _ids(RABBITMQ_MAX_PRIORITY=0) == _ids(RABBITMQ_MAX_PRIORITY=256) == _ids(RABBITMQ_MAX_PRIORITY="10") \
        == {"composition.E013"}
    assert _ids(RABBITMQ_MAX_PRIORITY=10) == set()
    assert _ids(RABBITMQ_QUEUE_TYPE="quorum") == _ids(RABBITMQ_QUEUE_TYPE="classic") == set()
    assert _ids(RABBITMQ_QUEUE_TYPE="stream") == {"composition.E014"}
    assert _ids(RABBITMQ_DELIVERY_LIMIT=0) == _ids(RABBITMQ_DELIVERY_LIMIT=True) == {"composition.E015"}
    assert _ids(RABBITMQ_QUEUE_TYPE="quorum", RABBITMQ_MAX_PRIORITY=10) == {"composition.E016"}
    assert _ids(WORKER_THREADS=0) == {"composition.E005"}
    assert _ids(HEALTH_DEPENDENCIES={"cache": "sometimes"}) == {"composition.E006"}
    assert _ids(CACHE_ALIAS="nope") == {"composition.E007"}
    assert _ids(LOG_FORMAT="json") == {"composition.W003"}  # deprecated: known, but does nothing
    assert _ids(LOG_LEVEL="INFO") == {"composition.W003"}
    assert _ids(WORKER_HEARTBEAT_S=10, WORKER_STALE_AFTER_S=5) == {"composition.W002"}
    with override_settings(COMPOSITION=[1, 2]):
        assert {m.id for m in check_settings()} == {"composition.E001"}


def test_each_deprecated_key_is_named_in_its_warning() -> None:
    for key, value in (("LOG_FORMAT", "json"), ("LOG_LEVEL", "INFO")):
        with override_settings(COMPOSITION={**settings.COMPOSITION, key: value}):
            assert [(m.id, key in m.msg) for m in check_settings()] == [("composition.W003", True)]


def test_conf_is_lazy_and_follows_override_settings() -> None:
    assert DEFAULTS["SHUTDOWN_TIMEOUT_S"] == conf.SHUTDOWN_TIMEOUT_S
    with override_settings(COMPOSITION={"SHUTDOWN_TIMEOUT_S": 3.0}):
        assert conf.SHUTDOWN_TIMEOUT_S == 3.0
    assert DEFAULTS["SHUTDOWN_TIMEOUT_S"] == conf.SHUTDOWN_TIMEOUT_S


def test_a_relay_budget_close_to_its_time_limit_is_warned_about() -> None:
    from composition.checks import check_outbox_settings

    def outbox_ids(**overrides: object) -> set[str]:
        with override_settings(COMPOSITION={**settings.COMPOSITION, **overrides}):
            return {message.id for message in check_outbox_settings()}

    assert outbox_ids() == set()
    assert outbox_ids(OUTBOX_RELAY_BUDGET_S=70, OUTBOX_RELAY_TIME_LIMIT_S=120) == {"composition.W021"}
    assert outbox_ids(OUTBOX_RELAY_BUDGET_S=0) == {"composition.E020"}
    # A broker loss's look-back within what the ledger (7 days), the dead letters (30) and the
    # outbox (7) keep: it sends again the sent rows of jobs that never ran.
    assert outbox_ids(BROKER_LOSS_LOOKBACK_S=8 * 86_400) == {"composition.E023"}
    assert outbox_ids(BROKER_LOSS_LOOKBACK_S=8 * 86_400, INBOX_RETENTION_S=None, OUTBOX_RETENTION_S=None) == set()
    assert outbox_ids(OUTBOX_RETENTION_S=3600) == {"composition.E023"}
    assert outbox_ids(BROKER_LOSS_LOOKBACK_S=40 * 86_400, INBOX_RETENTION_S=None) == {"composition.E023"}
    assert outbox_ids(BROKER_LOSS_CHECK_INTERVAL_S=0) == {"composition.E020"}


def test_another_database_than_postgresql_is_an_error() -> None:
    import subprocess
    import sys

    from composition.testing import subprocess_env

    result = subprocess.run([sys.executable, "manage.py", "check"], capture_output=True, text=True, timeout=60,
                            env=subprocess_env(DJANGO_SETTINGS_MODULE="tests.settings_sqlite"))
    assert result.returncode == 1
    assert "composition.E011" in result.stderr and "needs PostgreSQL" in result.stderr


def test_an_empty_prometheus_multiproc_dir_is_an_error(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from composition.checks.settings import check_metrics_settings

    # Set but empty (an env file's `PROMETHEUS_MULTIPROC_DIR=`): prometheus_client goes
    # multiprocess on the name alone and writes its files into the working directory.
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "")
    assert "composition.E075" in {message.id for message in check_metrics_settings()}
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")
    assert "composition.E075" not in {message.id for message in check_metrics_settings()}


def test_queue_names_no_job_uses_are_reported() -> None:
    # A misspelt queue in these settings did nothing and said nothing; in WORKER_QUEUES it was
    # found only when runworkers refused to start, after the deploy's checks had passed.
    from composition.broker.configured import configured_broker
    from composition.checks import check_queue_names
    from composition.sampling.queues import declared_queues

    def found(**composition: object) -> list[tuple[str, str]]:
        with override_settings(COMPOSITION={**settings.COMPOSITION, **composition}):
            return [(message.id, message.msg) for message in check_queue_names()]

    assert found() == []
    declared = [queue for queue in declared_queues(configured_broker()) if queue != "composition.outbox"]
    assert found(WORKER_QUEUES=declared) == []
    assert found(WORKER_QUEUES=[*declared, "billing_typo"]) == [
        ("composition.E017", "COMPOSITION['WORKER_QUEUES'] names ['billing_typo'], which no job uses: runworkers "
                             "refuses to start with it.")]
    (left_out,) = found(WORKER_QUEUES=declared[1:])
    assert left_out[0] == "composition.W018" and repr([declared[0]]) in left_out[1]
    assert [check_id for check_id, _ in found(SHED_QUEUES=["remindrs"], SHED_ESSENTIAL_QUEUES=["biling"],
                                              BACKPRESSURE_QUEUES={"biling": 5})] == ["composition.W053"] * 3
    # The relay's queue is every worker's, though its actor is declared only on first use.
    assert found(BACKPRESSURE_QUEUES={"composition.outbox": 5}) == []
    assert found(WORKER_QUEUES=7) == []  # malformed: E012's to report, not a crash here


def test_a_broker_url_it_cannot_use_is_a_check_error_not_a_traceback_from_app_loading() -> None:
    # Every command (check, migrate, even help) died in a 30-line traceback from ready().
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "check"], cwd=ROOT, capture_output=True, text=True,
                          env=subprocess_env(BROKER_URL="http://127.0.0.1:6379"), timeout=120)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "(composition.E003) COMPOSITION['BROKER_URL'] has scheme 'http'" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_deploy_without_a_metrics_directory_is_warned_of(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each gunicorn worker's /metrics showed its own process only, and no check said so.
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.delenv("prometheus_multiproc_dir", raising=False)
    assert [message.id for message in check_metrics_directory()] == ["composition.W076"]
    assert "composition.W076" not in {message.id for message in run_checks(include_deployment_checks=False)}
    monkeypatch.setenv("prometheus_multiproc_dir", "/tmp/somewhere")  # not what the library reads
    assert [message.id for message in check_metrics_directory()] == ["composition.W076"]
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "/tmp/somewhere")
    assert check_metrics_directory() == []
