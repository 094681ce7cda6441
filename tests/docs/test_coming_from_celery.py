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


def _keywords(function: str) -> set[str]:
    """The keyword names given to ``function(...)`` in the page's code: its examples, every code
    span that parses as Python (``@job(queue="x")`` as ``job(queue="x")``), and the ``name=`` of a
    call written as a pattern (``@job(queue=, max_attempts=...)``)."""
    found: set[str] = set()
    for arguments in re.findall(rf"\b{function}\(([^()`]*)\)", PAGE):
        found |= set(re.findall(r"(\w+)=", arguments))
    for code in [*CODE, *(span.lstrip("@") for span in re.findall(r"`([^`\n]+)`", PAGE))]:
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == function:
                found |= {keyword.arg for keyword in node.keywords if keyword.arg is not None}
    return found


def test_its_commands_and_runworkers_options_exist() -> None:
    named = set(re.findall(r"manage\.py (\w+)", PAGE)) | {"runworkers"}
    assert named - set(get_commands()) == set()
    parser = load_command_class("composition", "runworkers").create_parser("manage.py", "runworkers")
    options = {option for action in parser._actions for option in action.option_strings}
    assert set(re.findall(r"runworkers[^`|]*?(--[\w-]+)", PAGE)) - options == set()
    # `manage.py queues pause`, `deadletters list\|show`: the actions each command takes.
    for command, actions in re.findall(r"manage\.py (\w+) ([a-z][\w-]*(?:\\\|[a-z][\w-]*)*)", PAGE):
        parser = load_command_class(get_commands()[command], command).create_parser("manage.py", command)
        choices = {choice for action in parser._actions if not action.option_strings and action.choices
                   for choice in action.choices}
        assert set(actions.split("\\|")) - choices == set(), command


def test_its_job_publish_and_schedule_arguments_exist() -> None:
    for name, function in (("job", job), ("publish", publish), ("schedule", schedule)):
        given = _keywords(name)
        assert given, name  # the page shows each of them with arguments
        assert given - set(inspect.signature(function).parameters) == set(), name


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
