"""Every relative Markdown link of README.md and docs/*.md reaches a file, and its anchor a
heading; prose lines fit in 100 characters.

Anchors follow GitHub's rule: the heading text lowercased, punctuation other than ``-`` and
``_`` removed, spaces turned into ``-``; a repeated heading gets ``-1``, ``-2``, …
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def prose(text):
    """The lines of a Markdown text outside fenced code blocks."""
    fence = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if not fence:
            yield line


def slug(heading):
    """GitHub's anchor of a heading's text."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    """Every anchor a Markdown file defines, repeated headings numbered as GitHub does."""
    seen, out = {}, set()
    for line in prose(path.read_text()):
        m = HEADING.match(line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path):
    """The relative link targets of a Markdown file (web and mail links left out)."""
    # Joined, so that a link's text may run over a line break; inline code holds no link.
    text = re.sub(r"`[^`]*`", "", "\n".join(prose(path.read_text())))
    for target in LINK.findall(text):
        if not re.match(r"[a-z][a-z0-9+.-]*:", target):
            yield target


def test_the_slug_rule():
    assert slug("Security: a vendor's folder is data") == "security-a-vendors-folder-is-data"
    assert slug("Profiling a test: --profile-trace") == "profiling-a-test---profile-trace"
    assert slug("Summary (`milarun summary`)") == "summary-milarun-summary"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for target in links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.name}")
    assert not broken, "\n".join(broken)


def test_every_docs_page_is_in_the_index():
    index = set(links(ROOT / "docs" / "README.md"))
    pages = {p.name for p in PAGES if p.parent.name == "docs" and p.name != "README.md"}
    assert pages <= {t.partition("#")[0] for t in index}


@pytest.mark.parametrize("page", [ROOT / "CHANGELOG.md", *PAGES], ids=lambda p: p.name)
def test_prose_lines_fit_in_100_characters(page):
    """Prose is wrapped at 100 characters; a table row, a heading, HTML, code and a line of
    one unbreakable word (a long link) may be longer."""
    long = [
        f"{page.name}:{n}: {len(line)} characters"
        for n, line in enumerate(prose(page.read_text()), 1)
        if len(line) > 100 and not line.lstrip().startswith(("|", "#", "<")) and " " in line.strip()
    ]
    assert not long, "\n".join(long)
