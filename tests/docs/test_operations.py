"""The operations material is true:

- ``docker/alerts.yml`` passes ``promtool check rules`` and names only catalogued metrics;
- every panel of the Grafana dashboard queries catalogued metrics, in valid PromQL;
- every runbook step in ``docs/operations.md`` (its Runbooks part) names metrics, alerts,
  ``manage.py`` commands and admin addresses that exist.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import get_commands, load_command_class
from django.urls import Resolver404, resolve

from tests.browser import tool_missing
from tests.metrics_catalogue import (
    DOCKER,
    DOCS,
    METRIC_NAME,
    catalogue,
    metric_in_catalogue,
)

yaml = pytest.importorskip("yaml")


def _alert_rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load((DOCKER / "alerts.yml").read_text())["groups"]
            for rule in group["rules"] if "alert" in rule]


def _promtool() -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        tool_missing("promtool is not installed (`make promtool` installs Debian's prometheus as root)")
    return promtool


def test_promtool_accepts_the_alert_rules() -> None:
    promtool = _promtool()
    result = subprocess.run([promtool, "check", "rules", str(DOCKER / "alerts.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# promtool's unit test of ScheduleNotFiring: a schedule whose next tick was at t=120 s, and no
# scheduler left to move it; time() is the evaluation time, in seconds from 0.
SCHEDULE_ALERT_TEST = """
rule_files: [{rules}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'composition_schedule_next_fire_timestamp_seconds{{schedule="nightly", instance="w1"}}'
        values: '120x20'
      - series: 'composition_schedule_next_fire_timestamp_seconds{{schedule="busy", instance="w1"}}'
        values: '60+60x20'
    alert_rule_test:
      - eval_time: 6m
        alertname: ScheduleNotFiring
        exp_alerts: []
      - eval_time: 10m
        alertname: ScheduleNotFiring
        exp_alerts:
          - exp_labels: {{severity: page, schedule: nightly}}
            exp_annotations:
              summary: "Schedule nightly is 8m 0s past its tick"
              runbook: "docs/operations.md#schedule-not-firing"
"""


def _promtool_unit_test(tmp_path: Path, template: str) -> None:
    """Run ``promtool test rules`` on ``template`` (its ``{rules}``: docker/alerts.yml)."""
    promtool = _promtool()
    test_file = tmp_path / "alerts_test.yml"
    test_file.write_text(template.format(rules=DOCKER / "alerts.yml"))
    result = subprocess.run([promtool, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_schedule_not_firing_fires_when_every_scheduler_stopped_and_not_while_one_runs(tmp_path: Path) -> None:
    _promtool_unit_test(tmp_path, SCHEDULE_ALERT_TEST)


# promtool's unit test of NoWorkerUp: the last worker is gone from discovery after 3 minutes
# (its series stale): WorkerHeartbeatStale loses its series, this one fires.
NO_WORKER_ALERT_TEST = """
rule_files: [{rules}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'composition_worker_heartbeat_timestamp_seconds{{instance="w1"}}'
        values: '0+60x3 stale'
    alert_rule_test:
      - eval_time: 4m
        alertname: NoWorkerUp
        exp_alerts: []
      - eval_time: 6m
        alertname: NoWorkerUp
        exp_alerts:
          - exp_labels: {{severity: page}}
            exp_annotations:
              summary: "No worker is up: no job runs and no schedule fires"
              runbook: "docs/operations.md#queue-piling-up"
"""


def test_no_worker_up_fires_when_every_worker_is_down_or_gone(tmp_path: Path) -> None:
    _promtool_unit_test(tmp_path, NO_WORKER_ALERT_TEST)


# promtool's unit test of the queue alerts: two queues whose oldest message has waited 10 minutes
# and whose backlog grew by 2,000; one of them paused since the start.
QUEUE_ALERTS_TEST = """
rule_files: [{rules}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'composition_broker_oldest_message_age_seconds{{queue="stuck", instance="w1"}}'
        values: '600+60x30'
      - series: 'composition_broker_oldest_message_age_seconds{{queue="held", instance="w1"}}'
        values: '600+60x30'
      - series: 'composition_queue_depth_messages{{queue="stuck", instance="w1"}}'
        values: '1100+150x30'
      - series: 'composition_queue_depth_messages{{queue="held", instance="w1"}}'
        values: '1100+150x30'
      - series: 'composition_queue_paused{{queue="stuck", instance="w1"}}'
        values: '0x30'
      - series: 'composition_queue_paused{{queue="held", instance="w1"}}'
        values: '1x30'
    alert_rule_test:
      - eval_time: 27m
        alertname: BrokerOldestMessageTooOld
        exp_alerts:
          - exp_labels: {{severity: page, queue: stuck}}
            exp_annotations:
              summary: "Queue stuck: oldest message waiting 37m 0s"
              runbook: "docs/operations.md#queue-piling-up"
      - eval_time: 27m
        alertname: QueueDepthGrowing
        exp_alerts:
          - exp_labels: {{severity: warning, queue: stuck}}
            exp_annotations:
              summary: "Queue stuck is piling up (5150 messages)"
              runbook: "docs/operations.md#queue-piling-up"
"""


def test_the_queue_alerts_leave_a_paused_queue_out(tmp_path: Path) -> None:
    _promtool_unit_test(tmp_path, QUEUE_ALERTS_TEST)


# promtool's unit test of a broker outage as the targets report it: the workers' sampler stops
# reading the broker at 2m (its queue gauges keep their last reading, 0), the outbox backlog ages
# (the sweeper samples it after each failed round), the heartbeat goes on. Nothing paged: the
# frozen gauges cleared every queue alert. (That the web exports no heartbeat sample is
# tests/core/test_metrics.py's.)
BROKER_OUTAGE_TEST = """
rule_files: [{rules}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'composition_broker_read_timestamp_seconds{{queue="billing", instance="worker:9100"}}'
        values: '0+60x2 120x10'
      - series: 'composition_broker_oldest_message_age_seconds{{queue="billing", instance="worker:9100"}}'
        values: '0x12'
      - series: 'composition_queue_paused{{queue="billing", instance="worker:9100"}}'
        values: '0x12'
      - series: 'composition_outbox_oldest_pending_age_seconds{{instance="worker:9100"}}'
        values: '0x2 60+60x10'
      - series: 'composition_worker_heartbeat_timestamp_seconds{{role="worker", instance="worker:9100"}}'
        values: '0+60x12'
      - series: 'up{{job="billing-worker", instance="worker:9100"}}'
        values: '1x12'
    alert_rule_test:
      - eval_time: 3m
        alertname: BrokerUnread
        exp_alerts: []
      - eval_time: 6m
        alertname: BrokerUnread
        exp_alerts:
          - exp_labels: {{severity: page, queue: billing}}
            exp_annotations:
              summary: "Queue billing: the broker has not been read for 4m 0s"
              runbook: "docs/operations.md#queue-piling-up"
      - eval_time: 6m
        alertname: OutboxNotRelaying
        exp_alerts: []
      - eval_time: 8m
        alertname: OutboxNotRelaying
        exp_alerts:
          - exp_labels: {{severity: page}}
            exp_annotations:
              summary: "Outbox rows have waited 6m 0s to be relayed to the broker"
              runbook: "docs/operations.md#queue-piling-up"
      - eval_time: 6m
        alertname: BrokerOldestMessageTooOld
        exp_alerts: []
      - eval_time: 10m
        alertname: WorkerHeartbeatStale
        exp_alerts: []
      - eval_time: 10m
        alertname: NoWorkerUp
        exp_alerts: []
"""


def test_a_broker_outage_pages_while_the_queue_gauges_keep_their_last_reading(tmp_path: Path) -> None:
    _promtool_unit_test(tmp_path, BROKER_OUTAGE_TEST)


def test_the_alerts_are_loaded_name_catalogued_metrics_and_link_a_runbook() -> None:
    prometheus = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    mounted = dict(volume.rsplit(":", 2)[:2] for volume in compose["services"]["prometheus"]["volumes"])
    assert mounted.get("./alerts.yml") in prometheus["rule_files"], "prometheus.yml does not load alerts.yml"
    known = catalogue()
    anchors = _runbook_anchors()
    names = {rule["alert"] for rule in _alert_rules()}
    assert {"DeadLettersGrowing", "BrokerOldestMessageTooOld", "WorkerHeartbeatStale", "CircuitBreakerOpen",
            "DatabaseConnectionsNearBudget"} <= names
    for rule in _alert_rules():
        metrics = METRIC_NAME.findall(rule["expr"])
        assert metrics, f"{rule['alert']} names no catalogued metric"
        assert [m for m in metrics if not metric_in_catalogue(m, known)] == [], rule["alert"]
        runbook = rule["annotations"]["runbook"]
        assert runbook.startswith("docs/operations.md#") and runbook.split("#", 1)[1] in anchors, runbook


# -- the dashboard ------------------------------------------------------------------------------
def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def test_every_dashboard_panel_queries_catalogued_metrics(tmp_path: Path) -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    provider = yaml.safe_load((DOCKER / "grafana" / "dashboards.yaml").read_text())["providers"][0]
    mounts = dict(volume.rsplit(":", 2)[:2] for volume in compose["services"]["grafana"]["volumes"])
    assert mounts["./grafana/dashboards"] == provider["options"]["path"], "the dashboards are not provisioned"
    datasource_uid = yaml.safe_load((DOCKER / "grafana" / "datasources.yaml").read_text())["datasources"][0]["uid"]
    known = catalogue()
    dashboards = sorted((DOCKER / "grafana" / "dashboards").glob("*.json"))
    assert dashboards
    exprs: list[str] = []
    for path in dashboards:
        dashboard = json.loads(path.read_text())
        rows = {panel["title"] for panel in _panels(dashboard) if panel["type"] == "row"}
        assert {"Queues", "Dead letters", "Workers", "Cache", "Locks", "Database", "HTTP"} <= rows
        for panel in _panels(dashboard):
            if panel["type"] == "row":
                continue
            assert panel["datasource"]["uid"] == datasource_uid, panel["title"]
            assert panel["targets"], f"panel {panel['title']!r} has no query"
            for target in panel["targets"]:
                metrics = METRIC_NAME.findall(target["expr"])
                assert metrics, f"panel {panel['title']!r}: {target['expr']} names no metric"
                unknown = [m for m in metrics if not metric_in_catalogue(m, known)]
                assert unknown == [], f"panel {panel['title']!r} queries metrics not in docs/metrics.md"
                exprs.append(target["expr"])
    promtool = _promtool()  # the names are checked above; PromQL syntax needs promtool
    # Every query as a recording rule: promtool parses each one as PromQL.
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:query{index}", "expr": expr}
                                                       for index, expr in enumerate(exprs)]}]}
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# -- the runbooks -------------------------------------------------------------------------------
RUNBOOKS = ("Queue piling up", "Pausing a queue", "Purging a queue", "A queue held by a limit", "Too many dead letters",
            "Low cache hit rate", "Stale cache after a write", "Lock time-outs", "Database out of connections",
            "Schedule not firing", "Migrations not applied")
PARTS = ("**Symptom.**", "**Alert and metric.**", "**Command.**", "**Admin screen.**", "**Fix.**")


def _runbooks() -> dict[str, str]:
    """The ``###`` sections under ``## Runbooks``, the page's last part, by title."""
    page = (DOCS / "operations.md").read_text()
    assert "\n## Runbooks\n" in page, "docs/operations.md has no Runbooks part"
    runbooks = page.split("\n## Runbooks\n", 1)[1]
    assert "\n## " not in runbooks, "the runbooks are the page's last part"
    sections = re.split(r"^### ", runbooks, flags=re.MULTILINE)[1:]
    return {section.split("\n", 1)[0].strip(): section for section in sections}


def _runbook_anchors() -> set[str]:
    return {re.sub(r"[^a-z0-9 -]", "", title.lower()).replace(" ", "-") for title in _runbooks()}


def _check_command(line: str) -> None:
    """``manage.py <name> <args>`` names a command that exists and parses ``args``."""
    name, *args = shlex.split(line)
    commands = get_commands()
    assert name in commands, f"manage.py {name}: no such command"
    parser = load_command_class(commands[name], name).create_parser("manage.py", name)
    parser.parse_args(args)  # raises CommandError on an unknown action or option


@pytest.mark.django_db  # the admin's URLs resolve against the project's urls
def test_every_runbook_step_names_things_that_exist() -> None:
    runbooks = _runbooks()
    assert tuple(runbooks) == RUNBOOKS
    known = catalogue()
    alerts = {rule["alert"] for rule in _alert_rules()}
    for title, text in runbooks.items():
        for part in PARTS:
            assert part in text, f"runbook {title!r} has no {part}"
        alert_part = text.split("**Alert and metric.**", 1)[1].split("**Command.**", 1)[0]
        named_alerts = set(re.findall(r"`([A-Z][A-Za-z]+)`", alert_part))
        assert named_alerts, f"{title!r} names no alert"
        assert named_alerts <= alerts, f"{title!r} names alerts that docker/alerts.yml lacks"
        metrics = METRIC_NAME.findall(text)
        assert metrics, f"{title!r} names no metric"
        assert [m for m in metrics if not metric_in_catalogue(m, known)] == [], title
        commands = re.findall(r"manage\.py ([^`\n#]+)", text)
        assert commands, f"{title!r} names no manage.py command"
        for command in commands:
            _check_command(command)
        screens = re.findall(r"(/admin/[\w/]+/)", text)
        assert screens, f"{title!r} names no admin screen"
        for screen in screens:
            try:
                resolve(screen)
            except Resolver404:
                pytest.fail(f"runbook {title!r} names {screen}, which does not resolve")
