"""``docs/coming_from_celery.md`` names only what exists: the ``manage.py`` commands and
``runworkers`` options, the ``@job``, ``publish`` and ``schedule`` arguments, the ``COMPOSITION``
keys and the names its examples import; and its examples are Python."""

from __future__ import annotations

import ast
import importlib
import inspect
import re

from django.core.management import get_commands, load_command_class

from composition.conf import DEFAULTS
from composition.jobs import job
from composition.outbox import publish
from composition.schedules import schedule
from tests.helpers import ROOT

PAGE = (ROOT / "docs" / "coming_from_celery.md").read_text()
CODE = re.findall(r"^```python\n(.*?)^```", PAGE, re.MULTILINE | re.DOTALL)


def _keywords(call: str) -> set[str]:
    """The keyword names given to ``call(...)`` anywhere in the page."""
    found: set[str] = set()
    for arguments in re.findall(rf"{re.escape(call)}\(([^()`]*)\)", PAGE):
        found |= set(re.findall(r"(\w+)=", arguments))
    return found


def test_its_commands_and_runworkers_options_exist() -> None:
    named = set(re.findall(r"manage\.py (\w+)", PAGE)) | {"runworkers"}
    assert named - set(get_commands()) == set()
    parser = load_command_class("composition", "runworkers").create_parser("manage.py", "runworkers")
    options = {option for action in parser._actions for option in action.option_strings}
    assert set(re.findall(r"runworkers[^`|]*?(--[\w-]+)", PAGE)) - options == set()


def test_its_job_publish_and_schedule_arguments_exist() -> None:
    for call, function in (("@job", job), ("publish", publish), ("schedule", schedule)):
        assert _keywords(call) - set(inspect.signature(function).parameters) == set(), call


def test_its_settings_exist() -> None:
    named = {key for key in re.findall(r"`([A-Z][A-Z0-9]*_[A-Z0-9_]+)`", PAGE)
             if not key.startswith(("CELERY_", "DRAMATIQ_"))}
    assert named - set(DEFAULTS) == set()


def test_its_examples_parse_and_their_composition_imports_resolve() -> None:
    assert len(CODE) >= 2
    for block in CODE:
        tree = ast.parse(block)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("composition"):
                module = importlib.import_module(node.module or "")
                assert [alias.name for alias in node.names if not hasattr(module, alias.name)] == []
