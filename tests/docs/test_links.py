"""Every relative link of the README and of ``docs/`` leads somewhere: to a file of the checkout,
and, with a ``#fragment`` into a page, to one of that page's headings (as GitHub names them)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# [text](target), outside code; an image's ![alt](target) too.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*$", re.MULTILINE)
FENCED = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def anchors(page: Path) -> set[str]:
    """GitHub's ids for the headings of ``page``: lower case, punctuation dropped, spaces as
    hyphens, a repeated one numbered."""
    seen: dict[str, int] = {}
    found = set()
    for title in HEADING.findall(FENCED.sub("", page.read_text())):
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def relative_links() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for target in LINK.findall(FENCED.sub("", page.read_text())):
            if not re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: are not ours
                found.append((str(page.relative_to(ROOT)), target))
    return found


def test_the_pages_link_to_each_other() -> None:
    links = relative_links()
    assert len(links) >= 30, links
    readme = {target for page, target in links if page == "README.md"}
    assert {f"docs/{page.name}" for page in PAGES[1:]} <= readme, "a docs page the README does not link"


def test_the_anchors_are_read_as_github_does() -> None:
    page = ROOT / "docs" / "jobs.md"
    assert {"publish", "job-the-retry-policy", "from-commit-to-the-broker", "dead-letters"} <= anchors(page)


@pytest.mark.parametrize(("page", "target"), relative_links())
def test_a_relative_link_leads_somewhere(page: str, target: str) -> None:
    path, _, fragment = target.partition("#")
    source = ROOT / page
    linked = (source.parent / path).resolve() if path else source
    assert linked.exists(), f"{page}: {target} names no file"
    assert ROOT in linked.parents or linked == ROOT, f"{page}: {target} leads out of the checkout"
    if fragment:
        assert linked.suffix == ".md", f"{page}: {target}: a fragment into a page that is not markdown"
        assert fragment in anchors(linked), f"{page}: {target}: {linked.name} has no heading #{fragment}"
