"""
The documentation (README.md and docs/*.md) against the repository: every relative link leads to a file
or folder that exists, and a #fragment into a markdown file to one of its headings (GitHub's anchor of
the heading); every flag `train_llama_cpu --help` lists is documented somewhere; README.md stays a short
front page that starts with the two commands; every docs page can be reached from README.md.
Links to http(s) URLs are not checked (no network in CI).
The repository stands on its own: no tracked file refers to the team's briefs beside the checkout or to
issue numbers, and every docs page (and #anchor) a code comment names exists.
"""
import re
import subprocess

import pytest

from conftest import REPO, run

README = REPO / "README.md"
PAGES = [README] + sorted((REPO / "docs").glob("*.md"))
README_MAX_LINES = 260

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def split_code(text):
    """(prose lines, code text): fenced blocks and inline code spans go to code, the rest stays prose
    (a link written inside code is not a link)."""
    prose, code, fenced = [], [], False
    for line in text.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            code.append(line)
            prose.append("")
            continue
        code.extend(m.group(2) for m in CODE_SPAN.finditer(line))
        prose.append(CODE_SPAN.sub(lambda m: "x" * len(m.group(0)), line))
    return prose, "\n".join(code)


def slug(heading):
    """GitHub's anchor of a heading (github-slugger): the rendered text (code spans without their
    backticks, links as their text), lower case, every character but letters, digits, '_', '-' and spaces
    dropped, spaces made '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    """Every heading anchor of a markdown file, with GitHub's -1, -2, ... for repeated ones."""
    seen, result, fenced = {}, set(), False
    for line in path.read_text(encoding="utf-8").split("\n"):
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            result.add(base if n == 0 else f"{base}-{n}")
    return result


def links(path):
    """(line number, target) of every inline link, image and reference definition outside code."""
    prose, _ = split_code(path.read_text(encoding="utf-8"))
    found = []
    for number, line in enumerate(prose, 1):
        found += [(number, m.group(1)) for m in INLINE_LINK.finditer(line)]
        m = REFERENCE_DEF.match(line)
        if m:
            found.append((number, m.group(1)))
    return found


def broken_links(path):
    """One message per relative link of `path` that leads nowhere."""
    errors = []
    for number, target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):      # http(s), mailto, ...: not checked
            continue
        where = f"{path.relative_to(REPO)}:{number}: ({target})"
        file_part, _, fragment = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if REPO.resolve() not in (dest, *dest.parents):
            errors.append(f"{where} leaves the repository")
        elif not dest.exists():
            errors.append(f"{where}: {dest.relative_to(REPO.resolve())} does not exist")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            errors.append(f"{where}: no heading of {dest.relative_to(REPO.resolve())} has the anchor #{fragment}")
    return errors


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_links_resolve(page):
    errors = broken_links(page)
    assert not errors, "\n".join(errors)


def help_flags(trainer):
    r = run([trainer, "--help"])
    flags = re.findall(r"^\s+(--?[a-z0-9][a-z0-9-]*)\s", r.stdout + r.stderr, re.M)
    assert len(flags) > 20, r.stdout + r.stderr
    return flags


def test_every_flag_documented(trainer):
    """Each flag of --help appears in a code span or code block of README.md or a docs page."""
    code = "\n".join(split_code(p.read_text(encoding="utf-8"))[1] for p in PAGES)
    missing = [f for f in help_flags(trainer) if not re.search(r"(?<![\w-])" + re.escape(f) + r"(?![\w-])", code)]
    assert not missing, f"flags of `train_llama_cpu --help` that no page documents: {' '.join(missing)}"


def test_readme_is_a_front_page():
    lines = README.read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move detail to docs/"
    assert lines[:4] and lines[0] == "```" and lines[1].startswith("make train ") \
        and lines[2].startswith("make test ") and lines[3] == "```", \
        "README.md must start with the ``` block of `make train` and `make test`:\n" + "\n".join(lines[:4])


def test_every_page_linked_from_readme():
    linked = {(README.parent / t.partition("#")[0]).resolve() for _, t in links(README) if t.partition("#")[0]}
    orphans = [str(p.relative_to(REPO)) for p in PAGES[1:] if p.resolve() not in linked]
    assert not orphans, f"docs pages no link of README.md leads to: {' '.join(orphans)}"


# References that lead out of the repository: the team's design brief and style guide, anything else in the shared
# folder beside the checkout but the two inputs scripts and tests really read (the data folder, the netns cluster tool), and
# issue or pull-request numbers (an "owner/repo#N" or "project#N" cites a public project and stays).
OUTSIDE_REFERENCES = [
    (re.compile(r"\b(?:DESIGN|STYLE)\.md\b"), "a team brief"),
    (re.compile(r"\.\./shared\b(?!/data\b|/tools/netns_cluster\.sh\b)"), "a path beside the checkout that is no input"),
    (re.compile(r"\b(?:[Ii]ssues?|PRs?|[Pp]ull requests?) ?#?\d+|(?<![\w.\-/])#\d+\b"), "an issue number"),
]
CODE_SUFFIXES = {".c", ".h", ".cu", ".cuh", ".cpp", ".py", ".sh"}
# A docs page, with or without an #anchor; not a path inside another name (another project's docs folder).
DOCS_REFERENCE = re.compile(r"(?<![\w./-])docs/([\w.-]+\.md)(?:#([\w-]+))?")


def tracked_texts():
    """(path relative to the repository, text) of every tracked text file but the docs' images."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in files.decode().split("\0"):
        path = REPO / name
        if not name or name.startswith("docs/images/") or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue
        try:
            yield name, data.decode("utf-8")
        except UnicodeDecodeError:
            continue


def outside_references(texts):
    """One message per line of `texts` ((name, text) pairs) that refers out of the repository."""
    errors = []
    for name, text in texts:
        for number, line in enumerate(text.split("\n"), 1):
            for pattern, what in OUTSIDE_REFERENCES:
                m = pattern.search(line)
                if m:
                    errors.append(f"{name}:{number}: {what} ({m.group(0)!r}): refer to a docs/ page instead")
    return errors


def is_code(name):
    path = REPO / name
    return path.suffix in CODE_SUFFIXES or path.name == "Makefile" or name.startswith(".ci/")


def broken_docs_references(texts):
    """One message per docs page reference (and #anchor) in code files of `texts` that leads nowhere."""
    errors, page_anchors = [], {}
    for name, text in texts:
        if not is_code(name):
            continue
        for number, line in enumerate(text.split("\n"), 1):
            for m in DOCS_REFERENCE.finditer(line):
                page, fragment = REPO / "docs" / m.group(1), m.group(2)
                where = f"{name}:{number}: {m.group(0)}"
                if not page.is_file():
                    errors.append(f"{where}: docs/{m.group(1)} does not exist")
                    continue
                if fragment:
                    if page not in page_anchors:
                        page_anchors[page] = anchors(page)
                    if fragment not in page_anchors[page]:
                        errors.append(f"{where}: no heading of docs/{m.group(1)} has the anchor #{fragment}")
    return errors


def test_nothing_refers_outside_the_repository():
    errors = outside_references(tracked_texts())
    assert not errors, "\n".join(errors)


def test_docs_references_in_code_resolve():
    errors = broken_docs_references(tracked_texts())
    assert not errors, "\n".join(errors)


def test_reference_checks_catch_planted_faults():
    """Each check on lines it must reject and on lines it must let through (the planted faults)."""
    brief, style, issue, pr, bare = ("see " + "DESIGN" + ".md", "STYLE" + ".md", "issue" + " 19", "PR #" + "12", "(#" + "23)")
    shared = "../" + "shared/notes.md"
    bad = [brief, style, issue, pr, bare, shared]
    assert len(outside_references([("x.c", "\n".join(bad))])) == len(bad)
    good = ["../shared/data/tinyshakespeare", "../shared/tools/netns_cluster.sh up 2",
            "NVIDIA/cuDecomp#" + "24", "llm.c#" + "727", "docs/design.md#targets", "an issue order", "color #1f77b4"]
    assert outside_references([("x.c", "\n".join(good))]) == []

    page = "docs/" + "design.md"
    bad = [page + "#nope", "docs/" + "nope.md", "docs/" + "nope.md#targets"]
    for line in bad:
        assert len(broken_docs_references([("x.c", f"/* see {line} */")])) == 1, line
        assert len(broken_docs_references([("x.py", f"# see {line}")])) == 1, line
        assert len(broken_docs_references([("Makefile", f"# see {line}")])) == 1, line
    good = [page, page + "#targets", page + "#the-operand-map.", "mmaemu/docs" + "/nope.md"]
    assert broken_docs_references([("x.cuh", "\n".join(good))]) == []
    assert broken_docs_references([("x.md", "docs/" + "nope.md")]) == []    # pages: test_links_resolve
