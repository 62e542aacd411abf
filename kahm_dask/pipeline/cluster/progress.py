"""Progress on the console: every stage of a run named, timed, and its tasks counted.

The library is silent by default (:data:`SILENT`); the ``kahm-dask`` commands pass a
:class:`ConsoleProgress`, which writes to standard error, one line per stage::

    release (DP noise, ε = 2 per entry) ............ 0.3 s
    train [########################################] 20/20 clusters  2.9 s

A stage that runs tasks on a ``distributed`` client shows a bar of its tasks while it runs
(distributed's own progress tracking, relabelled); a stage without a client shows its name and,
when done, its time. Library logging (``-v``) is separate and off by default.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import IO, Any

__all__ = ["Progress", "ConsoleProgress", "SILENT", "as_progress"]

_WIDTH = 32  # the bar's characters
_LABEL = 40  # the label column


class Progress:
    """Silent progress: the interface :class:`ConsoleProgress` fills in."""

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Report the block inside as the stage ``name``."""
        yield

    def tasks(self, name: str, futures: Any, client: Any) -> None:
        """Show the progress of ``futures`` (running on ``client``) as the stage ``name`` until
        they finish (returns at once when silent)."""

    def note(self, text: str) -> None:
        """A line of its own (a result, a hint)."""


SILENT = Progress()


class ConsoleProgress(Progress):
    """Stage lines and task bars on ``stream`` (standard error by default)."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream

    def _write(self, text: str) -> None:
        stream = self.stream or sys.stderr
        with suppress(ValueError):  # a closed stream (interpreter exit)
            stream.write(text)
            stream.flush()

    @property
    def _live(self) -> bool:
        """Whether lines may be redrawn (a terminal); else only finished lines are written."""
        stream = self.stream or sys.stderr
        try:
            return stream.isatty()
        except (AttributeError, ValueError):
            return False

    def _done(self, name: str, seconds: float) -> None:
        self._write(("\r\33[2K" if self._live else "") + f"  {name + ' ':.<{_LABEL}} {seconds:.1f} s\n")

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        if self._live:
            self._write(f"  {name} ...")
        try:
            yield
        except BaseException:
            if self._live:
                self._write("\n")
            raise
        self._done(name, time.perf_counter() - t0)

    def tasks(self, name: str, futures: Any, client: Any) -> None:
        from distributed.diagnostics.progressbar import TextProgressBar

        write = self._write
        t0 = time.perf_counter()
        futures = futures if isinstance(futures, list | tuple) else [futures]
        if not self._live:
            from distributed import wait

            wait(futures)
            self._done(name, time.perf_counter() - t0)
            return

        class _Bar(TextProgressBar):
            def _draw_bar(self, remaining: int, all: int, **kwargs: Any) -> None:
                done = all - remaining
                bar = "#" * int(_WIDTH * (done / all if all else 1.0))
                write(f"\r\33[2K  {name:<{_LABEL - 1}} [{bar:<{_WIDTH}}] {done}/{all} tasks "
                      f"{time.perf_counter() - t0:.1f} s")

            def _draw_stop(self, **kwargs: Any) -> None:
                write("\r\33[2K")

        _Bar(futures, scheduler=client.scheduler.address, complete=True)
        self._done(name, time.perf_counter() - t0)

    def note(self, text: str) -> None:
        self._write(text.rstrip("\n") + "\n")


def as_progress(progress: Progress | bool | None) -> Progress:
    """``progress`` as a :class:`Progress`: True is a :class:`ConsoleProgress`, False and None
    are :data:`SILENT`."""
    if isinstance(progress, Progress):
        return progress
    return ConsoleProgress() if progress else SILENT
