"""The docs' relative links lead somewhere.

Every Markdown link [text](target) in README.md, docs/*.md and deepspeed_like/README.md
whose target is not a URL must name a file or directory that exists, relative to the
file the link is in; a #fragment must name a heading of the target Markdown file (as
GitHub makes heading anchors). Links inside code blocks and `code spans` are not links.
docs/README.md, the index of docs/, lists every file of docs/, and docs/make.md names
every .PHONY target of the Makefile and mk/*.mk.

Run:  .venv/bin/python -m pytest -q tests/conformance/test_docs_links.py
"""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
FILES = [ROOT / "README.md", *sorted(DOCS.glob("*.md")), ROOT / "deepspeed_like" / "README.md"]

LINK = re.compile(r"(?<!!)\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
URL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # http:, https:, mailto:, ...


def prose_lines(text):
    """(line number, line) outside fenced and indented code blocks, code spans blanked."""
    fence = None
    prev_blank = True
    in_indented = False
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        if fence:
            if stripped.startswith(fence):
                fence = None
            prev_blank = False
            continue
        m = re.match(r"(```+|~~~+)", stripped)
        if m:
            fence = m.group(1)
            continue
        if line.strip() == "":
            prev_blank = True
            continue
        # an indented code block starts after a blank line and lasts while indented
        if line.startswith("    ") and (prev_blank or in_indented) and not stripped.startswith(("-", "*", "|")):
            in_indented = True
            prev_blank = False
            continue
        if line.startswith("    ") and in_indented:
            continue
        in_indented = False
        prev_blank = False
        yield n, re.sub(r"`[^`]*`", "``", line)


def links(path):
    for n, line in prose_lines(path.read_text(encoding="utf-8")):
        for m in LINK.finditer(line):
            yield n, m.group(1)


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces -> '-'."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link keeps its text
    text = text.lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    seen = {}
    out = set()
    fence = None
    for line in path.read_text(encoding="utf-8").splitlines():
        stripped = line.lstrip()
        m = re.match(r"(```+|~~~+)", stripped)
        if fence:
            if stripped.startswith(fence):
                fence = None
            continue
        if m:
            fence = m.group(1)
            continue
        h = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not h:
            continue
        base = slug(h.group(1))
        k = seen.get(base, 0)
        seen[base] = k + 1
        out.add(base if k == 0 else f"{base}-{k}")
    return out


def broken(path):
    bad = []
    for n, target in links(path):
        if URL.match(target):
            continue
        file_part, _, frag = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{n}: ({target})"
        if not dest.exists():
            bad.append(f"{where}: no such file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
            continue
        if frag:
            if dest.is_dir() or dest.suffix != ".md":
                bad.append(f"{where}: #{frag} on a file that is not Markdown")
            elif frag not in anchors(dest):
                bad.append(f"{where}: {dest.relative_to(ROOT)} has no heading #{frag}")
    return bad


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    assert path.is_file(), f"{path} is missing"
    bad = broken(path)
    assert not bad, "broken links:\n  " + "\n  ".join(bad)


def test_front_page_links_into_docs():
    targets = {t.partition("#")[0] for _, t in links(ROOT / "README.md")}
    assert "docs/README.md" in targets
    for doc in sorted(DOCS.glob("*.md")):
        if doc.name != "README.md":
            assert f"docs/{doc.name}" in targets, f"README.md does not link docs/{doc.name}"


def test_docs_index_lists_every_file():
    targets = {t.partition("#")[0] for _, t in links(DOCS / "README.md")}
    for doc in sorted(DOCS.glob("*.md")):
        if doc.name != "README.md":
            assert doc.name in targets, f"docs/README.md does not list {doc.name}"


def phony_targets():
    """The .PHONY targets, as make expands them (make -p prints its database; -n runs
    nothing)."""
    out = subprocess.run(["make", "-pn", "--no-print-directory", "help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120).stdout
    names = set()
    for line in out.splitlines():
        if line.startswith(".PHONY:"):
            names.update(line.split(":", 1)[1].split())
    return names


@pytest.mark.skipif(not shutil.which("make"), reason="no make")
def test_make_targets_documented():
    targets = phony_targets()
    assert {"train", "test", "compare", "train-zero-tb"} <= targets, sorted(targets)
    text = (DOCS / "make.md").read_text(encoding="utf-8")
    missing = [t for t in sorted(targets)
               if not re.search(rf"(`{re.escape(t)}`|make {re.escape(t)}(?![\w-]))", text)]
    assert not missing, f"docs/make.md does not name these make targets: {missing}"


def test_checker_finds_broken_links(tmp_path, monkeypatch):
    """The checker itself: a missing file, a missing heading; code is not checked."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "a.md").write_text("# A\n\n## Two words: `x`\n")
    doc = tmp_path / "b.md"
    doc.write_text(
        "[ok](a.md) [ok](a.md#two-words-x) [ok](#b) [web](https://example.com/x)\n"
        "[gone](nope.md) [no heading](a.md#three)\n"
        "`[code](skipped.md)`\n\n    [indented](skipped.md)\n\n```\n[fenced](skipped.md)\n```\n"
        "# B\n")
    bad = broken(doc)
    assert len(bad) == 2, bad
    assert "nope.md" in bad[0] and "#three" in bad[1]
