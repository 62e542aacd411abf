"""The documented examples run as written, in order, twice, on one fresh account.

The fenced ``bash`` and ``python`` blocks of README.md and then docs/usage.md, in document order,
run in one fresh working directory (holding a copy of ``pipelines/``) with ``HOME`` a fresh
directory and neither ``KAHM_DASK_LEDGER_DIR`` nor ``XDG_DATA_HOME`` set, so every DP release is
charged to the default privacy ledger under that ``HOME``
(:func:`kahm_dask.privacy.ledger.default_ledger_dir`), as it is for a user who follows the
documentation. Bash blocks run with ``bash -euo pipefail``, Python blocks as script files (so
``if __name__ == "__main__":`` guards work). The whole sequence runs twice in the same ``HOME``
and directory: re-running the examples (ingest over the existing stores, the same run folder, the
ledger's spend growing) must work too, and never end in an unexplained refusal. The default ledger
is counted around each block: on the second pass a command-line block is charged nothing (its
commands resume or keep what they made) and a Python block what it was charged the first time.

Blocks of other languages (``console``, ``yaml``, …) are not run. A block that cannot run here
(an install command, the test suite itself, a remote scheduler, an object store, placeholder
paths) carries, on the line right before its fence, the Markdown comment

    <!-- docs-test: skip (why it cannot run) -->

and a block with a line that cannot run (but whose other lines can)

    <!-- docs-test: skip-line "text of the line" (why it cannot run) -->

which drops every line of the block containing that text. Every marker must name a reason,
stand right before a runnable block, and (``skip-line``) match a line of it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from kahm_dask.privacy.ledger import LEDGER_DIR_ENV, LEDGER_FILE, PrivacyLedger
from tests._kit import REPO

#: the documents whose examples run, in this order
DOCUMENTS = ("README.md", "docs/usage.md")
#: the fence languages that run; any other block is text
RUNNABLE = ("bash", "python")
#: what the examples read from the repository (relative paths they name)
NEEDED = ("pipelines",)

_FENCE = re.compile(r"^ {0,3}```[ \t]*([\w+-]*)[^\n]*$")
_MARKER = re.compile(r"^\s*<!--\s*docs-test:(.*?)-->\s*$")
_SKIP = re.compile(r'^\s*skip\s+\((?P<reason>[^()]*\S[^()]*)\)\s*$')
_SKIP_LINE = re.compile(r'^\s*skip-line\s+"(?P<text>[^"]+)"\s+\((?P<reason>[^()]*\S[^()]*)\)\s*$')


@dataclass(frozen=True)
class Block:
    """One fenced code block: where it is, its language, its code (the lines to run) and why it
    is skipped (``None``: it runs)."""

    document: str
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    skip: str | None = None

    @property
    def where(self) -> str:
        return f"{self.document}:{self.line} ({self.language})"


class MarkerError(ValueError):
    """A ``docs-test`` marker without a reason, in a form not understood, or not before a runnable block."""


def blocks(text: str, document: str) -> list[Block]:
    """The fenced blocks of the Markdown ``text`` in order, their ``docs-test`` markers applied.

    Raises :class:`MarkerError` for a marker without a reason, an unknown marker, a marker not on
    the line right before a ``bash``/``python`` fence, and a ``skip-line`` that matches no line.
    """
    lines = text.splitlines()
    found: list[Block] = []
    pending: tuple[int, str] | None = None  # (line, marker body) waiting for its fence
    i = 0
    while i < len(lines):
        marker = _MARKER.match(lines[i])
        fence = _FENCE.match(lines[i])
        if marker:
            if pending:
                raise MarkerError(f"{document}:{pending[0]}: a docs-test marker not right before a code block")
            pending = (i + 1, marker.group(1))
            i += 1
            continue
        if not fence:
            if pending:
                raise MarkerError(f"{document}:{pending[0]}: a docs-test marker not right before a code block")
            i += 1
            continue
        language, start = fence.group(1), i
        end = next((j for j in range(i + 1, len(lines)) if re.match(r"^ {0,3}```\s*$", lines[j])), None)
        if end is None:
            raise MarkerError(f"{document}:{start + 1}: a code block that is never closed")
        code = lines[start + 1:end]
        skip = None
        if pending:
            if language not in RUNNABLE:
                raise MarkerError(f"{document}:{pending[0]}: a docs-test marker before a {language or 'plain'} "
                                  f"block, which is not run anyway")
            skip, code = _apply(pending, code, document)
            pending = None
        found.append(Block(document, start + 1, language, "\n".join(code) + "\n", skip))
        i = end + 1
    if pending:
        raise MarkerError(f"{document}:{pending[0]}: a docs-test marker not right before a code block")
    return found


def _apply(marker: tuple[int, str], code: list[str], document: str) -> tuple[str | None, list[str]]:
    line, body = marker
    if m := _SKIP.match(body):
        return m.group("reason").strip(), code
    if m := _SKIP_LINE.match(body):
        kept = [c for c in code if m.group("text") not in c]
        if len(kept) == len(code):
            raise MarkerError(f"{document}:{line}: skip-line {m.group('text')!r} matches no line of the block")
        return None, kept
    raise MarkerError(f"{document}:{line}: a docs-test marker must be 'skip (reason)' or "
                      f"'skip-line \"text\" (reason)' with a reason; got {body.strip()!r}")


def documented_blocks() -> list[Block]:
    """The runnable-language blocks of :data:`DOCUMENTS`, in order (skipped ones included)."""
    return [b for doc in DOCUMENTS for b in blocks((REPO / doc).read_text(encoding="utf-8"), doc)
            if b.language in RUNNABLE]


# ------------------------------------------------------------------------- the parser itself
_SAMPLE = """# Page

```bash
echo one
```

<!-- docs-test: skip (needs a SLURM cluster) -->
```bash
sbatch job.sh
```

```console
$ not run
```

<!-- docs-test: skip-line "combine" (placeholder paths) -->
```bash
echo two
kahm-dask combine a b c
```

```python
print(3)
```
"""


def test_blocks_are_found_in_order_with_their_markers():
    found = blocks(_SAMPLE, "page.md")
    assert [(b.line, b.language, b.skip) for b in found] == [
        (3, "bash", None), (8, "bash", "needs a SLURM cluster"), (12, "console", None), (17, "bash", None),
        (22, "python", None)]
    assert found[3].code == "echo two\n" and found[4].code == "print(3)\n"


@pytest.mark.parametrize("marker", [
    "<!-- docs-test: skip -->", "<!-- docs-test: skip () -->", "<!-- docs-test: skip ( ) -->",
    "<!-- docs-test: ignore (why) -->", '<!-- docs-test: skip-line "x" -->',
    '<!-- docs-test: skip-line "nope" (why) -->'])
def test_a_marker_without_a_reason_or_match_is_an_error(marker):
    with pytest.raises(MarkerError):
        blocks(f"{marker}\n```bash\necho x\n```\n", "page.md")


@pytest.mark.parametrize("text", [
    "<!-- docs-test: skip (why) -->\n\n```bash\necho x\n```\n",          # not right before the fence
    "<!-- docs-test: skip (why) -->\n```yaml\na: 1\n```\n",                # a block that is not run
    "<!-- docs-test: skip (why) -->\n",                                    # before nothing
])
def test_a_misplaced_marker_is_an_error(text):
    with pytest.raises(MarkerError):
        blocks(text, "page.md")


def test_every_skipped_block_of_the_documents_names_its_reason():
    """The documents parse (every marker is well formed and placed), and most examples run."""
    found = documented_blocks()
    skipped = [b for b in found if b.skip is not None]
    assert all(b.skip.strip() for b in skipped)
    assert len(found) - len(skipped) >= 8, [b.where for b in found if b.skip is None]


# ------------------------------------------------------------------------- the examples, twice
def _account(root: Path) -> tuple[Path, dict[str, str]]:
    """A fresh working directory with what the examples read, and the environment of a fresh
    account: ``HOME`` under ``root``, no ledger directory set, this interpreter's ``kahm-dask``."""
    home, work = root / "home", root / "work"
    home.mkdir()
    work.mkdir()
    for name in NEEDED:
        shutil.copytree(REPO / name, work / name)
    env = {k: v for k, v in os.environ.items() if k not in (LEDGER_DIR_ENV, "XDG_DATA_HOME", "XDG_CONFIG_HOME",
                                                             "XDG_CACHE_HOME", "MPLCONFIGDIR")}
    env["HOME"] = str(home)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    return work, env


def _run(block: Block, work: Path, env: dict[str, str], index: int) -> subprocess.CompletedProcess:
    if block.language == "bash":
        args = ["bash", "-euo", "pipefail", "-c", block.code]
    else:
        script = work.parent / f"example_{index:02d}.py"  # beside the directory, not in it
        script.write_text(block.code, encoding="utf-8")
        args = [sys.executable, str(script)]
    return subprocess.run(args, cwd=work, env=env, capture_output=True, text=True, timeout=900, check=False)


@pytest.mark.slow  # 118 to 142 s (2 cores, load 1.1 to 3.4): every example of README.md and docs/usage.md, twice
def test_the_documented_examples_run_in_order_twice_on_a_fresh_account(tmp_path):
    examples = [b for b in documented_blocks() if b.skip is None]
    work, env = _account(tmp_path)
    ledgers = tmp_path / "home" / ".local" / "share" / "kahm-dask" / "ledgers"  # default_ledger_dir() there
    logs = tmp_path / "logs"
    logs.mkdir()
    timings: list[str] = []
    charged: dict[tuple[int, int], int] = {}  # (pass, block) → releases it added to the default ledger
    for attempt in (1, 2):
        for index, block in enumerate(examples):
            start, before = time.perf_counter(), _n_releases(ledgers)
            proc = _run(block, work, env, index)
            charged[attempt, index] = _n_releases(ledgers) - before
            timings.append(f"pass {attempt} {block.where}: {time.perf_counter() - start:.1f} s, "
                           f"{charged[attempt, index]} release(s) charged")
            (logs / f"{attempt}-{index:02d}.out").write_text(proc.stdout)
            (logs / f"{attempt}-{index:02d}.err").write_text(proc.stderr)
            assert proc.returncode == 0, (
                f"pass {attempt} of the documented examples: {block.where} exited with {proc.returncode}\n"
                f"--- code\n{block.code}--- stderr (tail)\n{proc.stderr[-3000:]}\n--- stdout (tail)\n"
                f"{proc.stdout[-1500:]}")
            for word in ("Traceback", "PrivacyLeakWarning", "ClippingWarning", "BudgetRefusalWarning"):
                assert word not in proc.stderr, f"pass {attempt}: {block.where}: {word}\n{proc.stderr[-3000:]}"
    print("\n".join(timings))
    assert sum(charged.values()) > 0, "the examples' releases were not charged to the default ledger under HOME"
    for index, block in enumerate(examples):
        if block.language == "bash":  # a command run again resumes or keeps what it made: no second charge
            assert charged[2, index] == 0, f"{block.where}: run again, it was charged again ({charged[2, index]})"
        else:  # a script fits again: the same releases again, no more
            assert charged[2, index] == charged[1, index], f"{block.where}: charged {charged[1, index]}, then " \
                                                           f"{charged[2, index]}"


def _n_releases(ledgers: Path) -> int:
    """The number of releases recorded in the ledger directory ``ledgers`` (0 before it exists)."""
    if not (ledgers / LEDGER_FILE).is_file():
        return 0
    return len(PrivacyLedger(ledgers).entries)
