"""The README is read in five minutes: at most 220 lines, short paragraphs, the test command CI
runs, and a tour whose code is the example's own (its commands run against a real ``./run`` in
``tests/scenarios/test_run_command.py``)."""

from __future__ import annotations

import re

from tests.helpers import ROOT, marked_block

README = ROOT / "README.md"
MAX_LINES = 220
# "About six lines": a paragraph of seven is a sentence too long; eight is a wall.
MAX_PARAGRAPH_LINES = 7


def test_the_readme_is_short() -> None:
    assert len(README.read_text().splitlines()) <= MAX_LINES


def test_no_paragraph_of_the_readme_is_a_wall() -> None:
    prose = re.sub(r"^```.*?^```", "", README.read_text(), flags=re.MULTILINE | re.DOTALL)
    for paragraph in re.split(r"\n\s*\n", prose):
        lines = paragraph.strip().splitlines()
        # Tables and lists are detail set out to be scanned, not read through.
        if lines and not lines[0].startswith(("|", "- ", "<!--")):
            assert len(lines) <= MAX_PARAGRAPH_LINES, paragraph


def test_ci_runs_the_test_command_the_readme_prints() -> None:
    commands = marked_block(README, "commands")
    assert [line.split()[0] for line in commands.splitlines() if not line.startswith(" ")] == ["./run", "make"]
    assert "make test " in commands
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.rstrip().splitlines()[-1] == "make test", "CI's last step is the README's test command"


def test_the_tour_excerpt_is_billing_s_own_code() -> None:
    """Each line of the tour's abridged excerpt is a line of the file it names, in order: the
    code a newcomer reads is the code that ran."""
    text = README.read_text()
    (source,) = re.findall(r"<!-- tour:excerpt (\S+) -->", text)
    code = [line.strip() for line in (ROOT / source).read_text().splitlines()]
    position = 0
    for line in marked_block(README, f"tour:excerpt {source}").splitlines():
        assert line.strip() in code[position:], f"{source} has no line {line.strip()!r} after line {position}"
        position = code.index(line.strip(), position) + 1
