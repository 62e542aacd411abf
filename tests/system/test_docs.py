"""The documentation's references resolve: every ``docs/<page>.md#<anchor>`` named in the code, the
tests, the benchmarks, the pipeline and cluster files, README.md and docs/ names a page that exists
and an anchor that page defines, and every relative Markdown link of README.md and docs/*.md
leads to an existing file (and anchor, when it names one).

Anchors are what GitHub renders: explicit ``<a id="…">`` tags (docs/algorithm.md, decisions.md
and oracles.md use these) and the slugs GitHub makes of headings.
"""

from __future__ import annotations

import re
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]

#: files whose text may name ``docs/<page>.md#<anchor>`` (this file's examples are made-up pages)
REFERRING = [
    *sorted(ROOT.glob("kahm_dask/**/*.py")),
    *sorted(p for p in ROOT.glob("tests/**/*.py") if p.resolve() != Path(__file__).resolve()),
    *sorted(ROOT.glob("benchmarks/**/*.py")),
    *sorted(p for p in ROOT.glob("pipelines/*") if p.is_file()),
    *sorted(p for p in ROOT.glob("cluster_configs/*") if p.is_file()),
    ROOT / "README.md",
    *sorted(ROOT.glob("docs/*.md")),
]
#: Markdown files whose relative links must resolve
MARKDOWN = [ROOT / "README.md", *sorted(ROOT.glob("docs/*.md"))]

_ANCHOR_TAG = re.compile(r"""<a\s+(?:id|name)\s*=\s*["']([^"']+)["']""")
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)
_FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[ \t]*$", re.M | re.S)
# a repository path of a Markdown page with an anchor: docs/<page>.md, cluster_configs/README.md, README.md
_REFERENCE = re.compile(r"(?<![\w./-])(?:\.\./)?((?:docs/[\w-]+|cluster_configs/README|README)\.md)#([\w-]+)")
_LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^()\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading (before de-duplication): the rendered text lowercased,
    punctuation other than ``-`` and ``_`` dropped, each space a hyphen."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)  # code spans keep their text
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links and images keep their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("\\", "")  # escapes: \* renders as *
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # \w: letters and digits of any script, and _
    return text.replace(" ", "-")


def _without_code_blocks(text: str) -> str:
    return _FENCE.sub("", text)


@cache
def anchors(path: Path) -> frozenset[str]:
    """Every anchor of the Markdown file ``path``: explicit tags, and the heading slugs with
    GitHub's ``-1``, ``-2``, … suffixes for repeated headings."""
    text = path.read_text(encoding="utf-8")
    found = set(_ANCHOR_TAG.findall(text))
    seen: Counter[str] = Counter()
    for _, heading in _HEADING.findall(_without_code_blocks(text)):
        slug = github_slug(heading)
        found.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return frozenset(found)


def references(path: Path) -> list[tuple[str, str]]:
    """The ``(page, anchor)`` pairs that ``path``'s text names, e.g. ``("docs/algorithm.md", "kahm")``."""
    return _REFERENCE.findall(path.read_text(encoding="utf-8"))


def links(path: Path) -> list[str]:
    """The targets of the Markdown links of ``path`` outside code (blocks and spans)."""
    text = re.sub(r"`[^`\n]*`", "", _without_code_blocks(path.read_text(encoding="utf-8")))
    return _LINK.findall(text)


def broken_references(path: Path, root: Path = ROOT) -> list[str]:
    """The ``docs/<page>.md#<anchor>`` references of ``path`` whose page or anchor does not exist."""
    broken = []
    for page, anchor in references(path):
        target = root / page
        if not target.is_file():
            broken.append(f"{page}#{anchor}: no file {page}")
        elif anchor not in anchors(target):
            broken.append(f"{page}#{anchor}: {page} has no anchor {anchor!r}")
    return broken


def broken_links(path: Path) -> list[str]:
    """The relative links of the Markdown file ``path`` whose file (or anchor) does not exist."""
    broken = []
    for target in links(path):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, …
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            broken.append(f"{target}: no file {linked}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no anchor {anchor!r} in {linked.name}")
    return broken


# ------------------------------------------------------------------------- the tools themselves
def test_the_slugs_and_anchors_are_githubs(tmp_path):
    """A page with known headings and tags: the anchors found are exactly GitHub's."""
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n## Securing the cluster (TLS)\n\n## 0. Fit 4× faster, routing\n\n"
        "## The regularisation parameter λ\\* and `solve_lambda`\n\n## Notes\n\n## Notes\n\n"
        '<a id="decision-s-rule"></a>**decision-s-rule** — text\n\n'
        "```bash\n# not a heading\n```\n"
    )
    assert anchors(page) == {
        "title", "securing-the-cluster-tls", "0-fit-4-faster-routing",
        "the-regularisation-parameter-λ-and-solve_lambda", "notes", "notes-1", "decision-s-rule",
    }
    assert "not-a-heading" not in anchors(page)


def test_references_and_links_are_found(tmp_path):
    text = tmp_path / "x.py"
    text.write_text('"""See docs/privacy.md#ledger and ../docs/design.md#known-limits, not xdocs/a.md#b."""\n'
                    "# cluster_configs/README.md#securing-the-cluster-tls\n")
    assert references(text) == [("docs/privacy.md", "ledger"), ("docs/design.md", "known-limits"),
                                ("cluster_configs/README.md", "securing-the-cluster-tls")]
    md = tmp_path / "x.md"
    md.write_text("[a](usage.md) [b](#top) ![img](p.png) `[c](code.md)` [d](https://x.org/y)\n"
                  "```\n[e](block.md)\n```\n[f [g] h](privacy.md#ledger \"title\")\n")
    assert links(md) == ["usage.md", "#top", "https://x.org/y", "privacy.md#ledger"]


def test_a_real_heading_is_found():
    """The check can fail: a heading of docs/privacy.md is an anchor, a made-up one is not."""
    assert "ledger" in anchors(ROOT / "docs" / "privacy.md")
    assert "no-such-heading" not in anchors(ROOT / "docs" / "privacy.md")


def test_broken_references_and_links_are_reported(tmp_path):
    """The checks can fail: a missing page, a missing anchor and a missing file are each reported,
    a good reference and link are not."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# Page\n\n## Known limits\n")
    code = tmp_path / "code.py"
    code.write_text("# docs/page.md#known-limits docs/page.md#nowhere docs/gone.md#x\n")
    assert broken_references(code, tmp_path) == ["docs/page.md#nowhere: docs/page.md has no anchor 'nowhere'",
                                                 "docs/gone.md#x: no file docs/gone.md"]
    md = tmp_path / "docs" / "other.md"
    md.write_text("[ok](page.md#known-limits) [a](page.md#nowhere) [b](gone.md) [c](#page)\n")
    assert [b.split(":")[0] for b in broken_links(md)] == ["page.md#nowhere", "gone.md", "#page"]


# --------------------------------------------------------------------------------- the checks
@pytest.mark.parametrize("path", REFERRING, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_named_docs_anchor_exists(path):
    assert broken_references(path) == []


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(path):
    assert broken_links(path) == []
