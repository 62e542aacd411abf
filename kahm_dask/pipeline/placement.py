"""Where each cluster model is evaluated: one home worker per model, so that a prediction loads
each model once, on one worker, and keeps it there (in that worker's model cache) for every
query block and every later prediction on the same workers.

Without a home, the scheduler places a cluster's distance task wherever its query block is, so
every worker loads every model (120 loads for MNIST's 60 clusters on 2 workers), and the loads
grow with the clusters times the workers. The homes split the models' rows evenly: a model's
load and its distance blocks both cost in proportion to its rows N_b (its arrays are
N_b × (p + 1) per layer; a block is O(m · N_b · (n + p))). The placement is a preference
(``allow_other_workers``): a task whose home worker is gone runs elsewhere.

Dask's graph optimisation fuses blockwise layers and, by default, intersects their worker
annotations, and its low-level fusion renames the tasks of linear chains, which drops their
annotations: either way a home's distance task merged into the minimum over the homes loses its
home. A placed graph is therefore computed without graph optimisation (``optimize_graph=False``),
as built: one task per block of each layer. Configuring the optimisation instead (annotated
layers kept apart, no low-level fusion) does not hold: Dask optimises a graph lazily where it is
materialised, on the distributed scheduler, in the scheduler's process and under its own
configuration, so a setting around the client's call does not reach a scheduler in another
process (there, every home was fused away).

A lazy result handed to the user is a :class:`PlacedArray`: a dask array whose own graph
optimisation only culls, so ``.compute()``, ``dask.compute`` and ``client.compute`` with their
defaults keep the homes (measured with distributed 2026.8: a plain dask array computed with its
defaults lost every home, and each worker loaded every model). An array derived from it
(``D[:10]``, ``D + 1``) is a plain dask array again: the same values, the homes left to Dask.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import dask
import dask.array as da
from dask.core import flatten

__all__ = ["model_homes", "placed", "worker_addresses", "PlacedArray", "as_placed"]


def model_homes(rows: Sequence[int], workers: Sequence[str]) -> list[str]:
    """The home worker of each model: ``rows[i]`` is model i's training rows.

    Largest first, each onto the worker with the fewest rows so far (the LPT rule: the most
    loaded worker gets at most 4/3 of the best possible share); ties by model order, then by
    the order of ``workers``. Deterministic for the same inputs.

    >>> model_homes([500, 400, 300, 300], ["w0", "w1"])
    ['w0', 'w1', 'w1', 'w0']
    """
    if not workers:
        raise ValueError("model_homes needs at least one worker.")
    heap = [(0, w) for w in range(len(workers))]  # (rows so far, worker index)
    homes = [""] * len(rows)
    for i in sorted(range(len(rows)), key=lambda i: (-rows[i], i)):
        held, w = heapq.heappop(heap)
        homes[i] = workers[w]
        heapq.heappush(heap, (held + int(rows[i]), w))
    return homes


def placed(worker: str | None) -> Any:
    """Context in which dask collections built get ``worker`` as their preferred place
    (a Dask annotation; no effect on the local schedulers, none for ``worker=None``)."""
    return nullcontext() if worker is None else dask.annotate(workers=[worker], allow_other_workers=True)


def worker_addresses(client: Any) -> list[str] | None:
    """The addresses of ``client``'s workers, sorted (None without a client or workers)."""
    if client is None:
        return None
    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    return workers or None


def _cull_only(dsk: Any, keys: Any, **kwargs: Any) -> Any:
    """The graph optimisation of :class:`PlacedArray`: the tasks the keys need, as built (no
    fusion, which would drop the layers' worker annotations)."""
    return dsk.cull(set(flatten(keys)))


class PlacedArray(da.Array):
    """A dask array computed as built: its graph is only culled, never fused, so the worker
    annotations of its layers (each cluster model's home) hold however it is computed.

    >>> import numpy as np
    >>> D = as_placed(da.from_array(np.arange(6.0).reshape(3, 2), chunks=2))
    >>> type(D).__name__, D.sum().compute()
    ('PlacedArray', np.float64(15.0))
    """

    __dask_optimize__ = staticmethod(_cull_only)


def as_placed(array: da.Array) -> PlacedArray:
    """``array`` (same graph, name, chunks and meta) as a :class:`PlacedArray`."""
    return PlacedArray(array.dask, array.name, array.chunks, meta=array._meta)
