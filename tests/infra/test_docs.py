"""The README and docs/ as a reader meets them: a README that fits two screens and points at every doc, the
test command CI runs, and links that lead somewhere."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
#: Two screens of a terminal or a rendered page: the README's budget (issue 35).
README_MAX_LINES = 150

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    found: set[str] = set()
    for heading in re.findall(r"^#+ (.+)$", FENCE.sub("", markdown), re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` whose file, or heading in that file, does not exist."""
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):  # http://, https://, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        missing_heading = file.exists() and anchor and file.suffix == ".md" and anchor not in anchors(file.read_text())
        if not file.exists() or missing_heading:
            broken.append(target)
    return broken


def test_the_readme_fits_two_screens_and_points_at_every_doc() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    linked = {target.partition("#")[0] for target in LINK.findall(text)}
    assert {f"docs/{doc.name}" for doc in DOCS} <= linked, sorted({f"docs/{d.name}" for d in DOCS} - linked)


def test_the_readmes_test_command_is_the_one_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^exec scripts/test$", ci, re.MULTILINE)
    two_commands = README.read_text().split("## The two commands", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```sh\n(.*?)^```", two_commands, re.MULTILINE | re.DOTALL)
    commands = [line.split("#", 1)[0].strip() for block in blocks for line in block.splitlines()]
    assert "scripts/test" in commands


def test_every_relative_link_of_the_readme_and_the_docs_leads_to_a_file_and_heading_that_exist() -> None:
    broken = {page.name: broken_links(page) for page in [README, *DOCS]}
    assert not any(broken.values()), {page: links for page, links in broken.items() if links}
