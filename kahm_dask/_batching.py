"""Row chunking for batch evaluation with bounded memory."""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["row_chunks"]


def row_chunks(n_rows: int, chunk_size: int) -> Iterator[slice]:
    """Yield consecutive row slices of at most ``chunk_size`` rows covering ``range(n_rows)``."""
    for start in range(0, n_rows, chunk_size):
        yield slice(start, min(start + chunk_size, n_rows))
