"""``composition`` reads as a map: each module's docstring says what it is in at most ten lines
(how it works goes beside the code, what happened in commits and test names), and each package's
``__init__`` names what it exports in ``__all__``."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import ROOT

MAX_DOCSTRING_LINES = 10
# Django finds manage.py commands by directory: nothing is imported from these packages.
NO_EXPORTS = {Path("composition/management/__init__.py"), Path("composition/management/commands/__init__.py")}


def _modules() -> list[Path]:
    return sorted(path.relative_to(ROOT) for path in (ROOT / "composition").rglob("*.py")
                  if "migrations" not in path.parts)


def test_every_module_says_what_it_is_in_at_most_ten_lines() -> None:
    too_long, missing = [], []
    for path in _modules():
        docstring = ast.get_docstring(ast.parse((ROOT / path).read_text()), clean=False)
        if not docstring:
            if path.name != "__init__.py" or (ROOT / path).read_text().strip():
                missing.append(str(path))
        elif len(docstring.splitlines()) > MAX_DOCSTRING_LINES:
            too_long.append(f"{path}: {len(docstring.splitlines())} lines")
    assert not missing, f"modules without a docstring: {missing}"
    assert not too_long, f"module docstrings over {MAX_DOCSTRING_LINES} lines: {too_long}"


def test_every_package_names_its_exports() -> None:
    unnamed = [str(path) for path in _modules() if path.name == "__init__.py" and path not in NO_EXPORTS
               and "__all__" not in {target.id for node in ast.parse((ROOT / path).read_text()).body
                                     if isinstance(node, (ast.Assign, ast.AnnAssign))
                                     for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                                     if isinstance(target, ast.Name)}]
    assert not unnamed, f"packages without __all__: {unnamed}"
