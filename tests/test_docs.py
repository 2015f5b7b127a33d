"""The documentation the code cites exists: every ``docs/...md#section`` named in a source file
resolves to a file and a heading, README section names resolve, Markdown links inside README.md
and docs/ resolve, and nothing cites the predecessor's design notes that are not in the repository.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve()

#: Design notes that live outside the repository; the code must cite docs/ instead.
#: (Spelled in pieces so that this file does not cite them itself.)
OUTSIDE = ("ARCHITECTURE" + ".md", "zero_sync" + "_hot_path", "mega_graph" + "_plan", "STYLE" + ".md")

SOURCE_DIRS = ("foxdqn", "conf", "tests", "bench", ".ci")
SOURCE_FILES = ("Makefile", "pyproject.toml")
SOURCE_SUFFIXES = {".py", ".yaml", ".yml", ".toml", ".cfg", ".ini", ".sh", ""}

CITATION = re.compile(r"(?<![\w/.-])(docs/(?:[\w-]+/)*[\w.-]+?\.md)(#[\w-]+)?")
README_SECTION = re.compile(r"""README[,:]?\s+(?:section\s+)?["'“]([^"'”\n]+)["'”]""")
MD_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link keeps its text
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def headings(md: Path) -> list[str]:
    """Heading texts of a Markdown file, outside fenced code blocks."""
    out, fenced = [], False
    for line in md.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            out.append(m.group(2))
    return out


def anchors(md: Path) -> set[str]:
    """Every anchor GitHub gives the headings of ``md`` (repeats get -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for h in headings(md):
        s = slug(h)
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


def check_target(path: str, anchor: str | None, root: Path = REPO) -> str | None:
    """None when ``path`` (relative to ``root``) exists and, for a Markdown file, has ``anchor``;
    else what is wrong."""
    target = (root / path).resolve()
    if root.resolve() not in (target, *target.parents):
        return f"{path} is outside the repository"
    if not target.exists():
        return f"{path} does not exist"
    if anchor and target.is_file() and target.suffix == ".md" and anchor not in anchors(target):
        return f"{path}#{anchor}: no such section (sections: {', '.join(sorted(anchors(target)))})"
    return None


def problems_in_text(text: str, where: str, root: Path = REPO) -> list[str]:
    """Every bad reference in the text of one source file."""
    out = []
    for name in OUTSIDE:
        if name in text:
            out.append(f"{where}: cites {name}, which is not in the repository; cite docs/ instead")
    for m in CITATION.finditer(text):
        err = check_target(m.group(1), (m.group(2) or "#")[1:] or None, root)
        if err:
            out.append(f"{where}: {err}")
    readme = root / "README.md"
    titles = {h.lower() for h in headings(readme)} if readme.exists() else set()
    for m in README_SECTION.finditer(text):
        if m.group(1).lower() not in titles:
            out.append(f"{where}: README has no section {m.group(1)!r}")
    return out


def problems_in_markdown(md: Path, root: Path = REPO) -> list[str]:
    """Bad relative links, and citations of the outside notes, in a Markdown file."""
    text = md.read_text(encoding="utf-8")
    where = str(md.relative_to(root))
    out = [f"{where}: cites {name}" for name in OUTSIDE if name in text]
    for m in MD_LINK.finditer(text):
        link = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", link):  # http:, https:, mailto:
            continue
        path, _, anchor = link.partition("#")
        target = (md.parent / path).resolve() if path else md.resolve()
        if not target.is_relative_to(root.resolve()):
            out.append(f"{where}: link {link} points outside the repository")
            continue
        rel = target.relative_to(root.resolve())
        err = check_target(rel.as_posix(), anchor or None, root)
        if err:
            out.append(f"{where}: link {link}: {err}")
    return out


def source_files() -> list[Path]:
    files = [REPO / f for f in SOURCE_FILES if (REPO / f).is_file()]
    for d in SOURCE_DIRS:
        for p in sorted((REPO / d).rglob("*")):
            if (p.is_file() and p.suffix in SOURCE_SUFFIXES and p.resolve() != THIS
                    and "results" not in p.relative_to(REPO).parts and "__pycache__" not in p.parts):
                files.append(p)
    return files


def markdown_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


# ---------------------------------------------------------------------------------------------
def test_source_citations_resolve():
    problems, cited = [], 0
    for p in source_files():
        text = p.read_text(encoding="utf-8", errors="replace")
        cited += len(CITATION.findall(text))
        problems += problems_in_text(text, str(p.relative_to(REPO)))
    assert not problems, "\n".join(problems)
    assert cited >= 30, f"only {cited} docs/ citations found: is the pattern still matching?"


def test_markdown_links_resolve():
    problems = [msg for md in markdown_files() for msg in problems_in_markdown(md)]
    assert not problems, "\n".join(problems)


def test_slug_follows_github():
    assert slug("Trading results (5 seeds, H200)") == "trading-results-5-seeds-h200"
    assert slug("The `skip` flag: on-device") == "the-skip-flag-on-device"
    assert slug("Q-value monitor") == "q-value-monitor"


def test_a_bad_reference_fails(tmp_path):
    """The checks can fail: a missing page, a missing section, an outside note, a README section."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# Page\n\n## Real section\n\n```\n## not a heading\n```\n")
    (tmp_path / "README.md").write_text("# Project\n\n## Two commands\n")
    good = "see docs/page.md#real-section and docs/page.md and README \"Two commands\""
    assert problems_in_text(good, "good.py", tmp_path) == []
    bad = {
        "docs/page.md#no-such-section": "no such section",
        "docs/page.md#not-a-heading": "no such section",
        "docs/missing.md": "does not exist",
        OUTSIDE[1] + ".md component A": "not in the repository",
        OUTSIDE[0] + " rule 5": "not in the repository",
        'README "Training controls"': "README has no section",
    }
    for text, needle in bad.items():
        found = problems_in_text(f"(see {text})", "bad.py", tmp_path)
        assert any(needle in msg for msg in found), (text, found)
    md = tmp_path / "docs" / "index.md"
    md.write_text("[a](page.md#real-section) [b](page.md#gone) [c](../../elsewhere.md) [d](https://x.org)\n")
    found = problems_in_markdown(md, tmp_path)
    assert len(found) == 2 and "no such section" in found[0] and "outside" in found[1], found


@pytest.mark.parametrize("page", ["design/hot_loop.md", "design/guard.md", "design/ring.md",
                                  "design/monitors.md", "design/update.md", "environments.md", "bench.md"])
def test_design_pages_are_linked_from_the_docs_index(page):
    assert f"({page}" in (REPO / "docs" / "README.md").read_text(encoding="utf-8")
