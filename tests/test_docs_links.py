"""The README and the pages under docs/: every relative link reaches a file (and a heading, when it
names one), every page is linked from the README, and the README stays short enough to read in a
first hour (issue 38: at most 250 lines)."""

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOC_PAGES = sorted((ROOT / "docs").glob("*.md"))
README_MAX_LINES = 250

# [text](target) and ![alt](target); the target ends at the first space (a title may follow) or ')'
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`+[^`]*`+")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text):
    """The lines outside fenced code blocks, with their 1-based numbers."""
    inside = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            yield number, line


def github_slug(heading):
    """The anchor GitHub gives a heading: the rendered text lower-cased, every character that is
    not a letter, digit, space, hyphen or underscore dropped, each space turned into a hyphen
    (runs of hyphens are kept, as GitHub keeps them)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path):
    """Every heading anchor of a markdown file; a repeated slug gets -1, -2, ... as on GitHub."""
    seen, result = {}, set()
    for _, line in prose_lines(path.read_text()):
        match = HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def relative_links(path):
    """(line number, target) of every link that is not a web address."""
    for number, line in prose_lines(path.read_text()):
        for match in LINK.finditer(INLINE_CODE.sub("", line)):
            target = match.group(1)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:, ...
                yield number, target


def broken_links(path, root=ROOT):
    broken = []
    for number, target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / unquote(file_part)).resolve() if file_part else path
        where = f"{path.relative_to(root)}:{number}: {target}"
        if not linked.exists():
            broken.append(f"{where} (no such file)")
        elif anchor and linked.suffix == ".md" and unquote(anchor).lower() not in anchors(linked):
            broken.append(f"{where} (no heading with that anchor in {linked.relative_to(root)})")
    return broken


def test_the_slug_rules_match_github():
    # expected by GitHub's rule, by hand: 'A run's files' -> drop the apostrophe, lower-case, spaces to
    # hyphens; ' — ' loses the dash and keeps both spaces, so two hyphens; backticks, dots, braces,
    # colons, commas and parentheses go; hyphens and underscores stay
    assert github_slug("A run's files") == "a-runs-files"
    assert github_slug("Comparing evals: paired statistics") == "comparing-evals-paired-statistics"
    assert github_slug("Sharding, launch files and memory") == "sharding-launch-files-and-memory"
    assert github_slug("`meds eval`") == "meds-eval"
    assert github_slug("EDAS (`edas`; Liu et al. 2026) — `algorithms/edas.py`") == (
        "edas-edas-liu-et-al-2026--algorithmsedaspy")
    assert github_slug("Run 3: the verdict (learning rate 1e-4, 8 steps)") == (
        "run-3-the-verdict-learning-rate-1e-4-8-steps")
    assert github_slug("5. Responses without `\\boxed{` (`meds.unboxed`)") == (
        "5-responses-without-boxed-medsunboxed")


def test_the_checker_finds_a_missing_file_and_a_missing_heading(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other\n\n## A section\n\n```bash\n# not a heading\n```\n")
    page.write_text("# Page\n\n[ok](other.md#a-section) [self](#page) [code](other.md#not-a-heading)\n"
                    "[gone](missing.md) `[in code](missing.md)`\n\n```\n[in a fence](missing.md)\n```\n")
    assert broken_links(page, root=tmp_path) == [
        "page.md:3: other.md#not-a-heading (no heading with that anchor in other.md)",
        "page.md:4: missing.md (no such file)"]


@pytest.mark.parametrize("path", [README, *DOC_PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    assert broken_links(path) == []


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / target.partition("#")[0]).resolve() for _, target in relative_links(README)}
    assert [p.name for p in DOC_PAGES if p.resolve() not in linked] == []


def test_the_readme_is_at_most_250_lines():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/"
