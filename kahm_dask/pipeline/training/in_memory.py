"""Stages 2–4 of a training run in worker memory, for rows that fit there.

The Zarr route (:mod:`~kahm_dask.pipeline.training.layout`,
:mod:`~kahm_dask.pipeline.training.partition`) writes two reordered copies of the rows to the
work store, so that a class (for its k-means) and a cluster (for its task) are contiguous
slices at any data size. For rows that fit the workers' memory those copies are work the
in-memory classifier never does. This route builds the same rows in memory:

1. one task per row chunk of each source (the noisy rows, and the private rows where the run
   reads them) splits the chunk's rows by class, keeping their order;
2. one task per class (:func:`cluster_class`) joins its pieces (the class's rows in their
   original order, as in the class-grouped copy), partitions them with the Zarr route's in-task
   k-means (:func:`~kahm_dask.pipeline.training.partition.partition_in_task`) or takes the
   caller's labels, caps the clusters' sizes, and returns the labels and the rows of each cluster
   (original order, as in the cluster-grouped copy);
3. each cluster task takes its rows from its class's result
   (:func:`~kahm_dask.pipeline.training.tasks.train_cluster_rows`).

The rows and their order are those of the Zarr route, so the labels and the models are the
same bit for bit. :func:`fits_in_memory` says when the route is taken: every class's k-means
fits one task, and the rows of all sources together take at most the budget of held rows
(``persist_fraction`` of the workers' memory). Private rows then never leave worker memory:
no copy of them is written to the work store.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import dask
import dask.array as da
import numpy as np
from dask.delayed import Delayed

from kahm_dask._random import child_seed_sequence
from kahm_dask.partition import cap_cluster_rows, default_min_cluster_size, n_branches
from kahm_dask.pipeline.training.layout import ClassLayout
from kahm_dask.pipeline.training.partition import fits_one_task, partition_in_task

__all__ = ["ClassClusters", "cluster_class", "fits_in_memory", "partition_in_memory"]


@dataclass(frozen=True)
class ClassClusters:
    """One class's partition, held by the worker that computed it.

    labels : (N_c,) int64, the within-class cluster label of each of the class's rows (in
             their original order).
    rows   : cluster label → source name → (N_cs, p) rows of that cluster, in original order.
    """

    labels: np.ndarray
    rows: dict[int, dict[str, np.ndarray]]


def fits_in_memory(sources: Mapping[str, da.Array], layout: ClassLayout, *, task_bytes: int,
                   persist_bytes: int) -> bool:
    """Whether the in-memory route applies: every class's k-means fits one task
    (:func:`~kahm_dask.pipeline.training.partition.fits_one_task`, the Zarr route's in-task rule) and
    the stored rows of all ``sources`` take at most ``persist_bytes`` together."""
    p = next(iter(sources.values())).shape[1]
    largest = max(b - a for _, a, b in layout.bounds)
    held = sum(x.nbytes for x in sources.values())
    return persist_bytes > 0 and fits_one_task(largest, p, task_bytes) and held <= persist_bytes


def _split_by_class(block: np.ndarray, codes: np.ndarray, classes: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """The rows of ``block`` (m, p) of each class code in ``classes``, in order (``codes``: (m,))."""
    return tuple(block[codes == c] for c in classes)


def cluster_class(
    pieces: Mapping[str, list[np.ndarray]], cluster_on: str, n_clusters: int, min_cluster_size: int,
    seed: np.random.SeedSequence, n_init: int, kmeans_dims: int | None, max_cluster_rows: int | None,
    given: np.ndarray | None = None,
) -> ClassClusters:
    """One class's task: join each source's ``pieces`` (in row order), partition the rows of
    ``cluster_on`` (``given`` labels instead, when the caller gave them; all zeros when
    ``n_clusters`` ≤ 1), cap the clusters at ``max_cluster_rows`` (not the caller's), and split
    every source's rows by cluster."""
    rows = {name: np.concatenate(parts) for name, parts in pieces.items()}
    n = len(next(iter(rows.values())))
    if given is not None:
        labels = np.asarray(given, dtype=np.int64)
    else:
        labels = np.zeros(n, dtype=np.int64)
        if n_clusters > 1:
            labels = partition_in_task(rows[cluster_on], n_clusters, min_cluster_size, seed, n_init, kmeans_dims)
        labels = cap_cluster_rows(labels, max_cluster_rows)
    return ClassClusters(labels, {int(s): {name: x[labels == s] for name, x in rows.items()}
                                  for s in np.unique(labels)})


def partition_in_memory(
    sources: Mapping[str, da.Array],
    y_codes: np.ndarray,
    layout: ClassLayout,
    cluster_on: str,
    *,
    n_components: int,
    block_size: int,
    s_rule: str,
    min_cluster_size: int | None,
    seed: np.random.SeedSequence,
    n_init: int,
    kmeans_dims: int | None,
    max_cluster_rows: int | None,
    partition: np.ndarray | None = None,
    client=None,
) -> tuple[np.ndarray, dict[tuple[int, int], Delayed]]:
    """Partition every class in worker memory; returns the (N,) within-class labels (original
    row order) and, per (class code, cluster label), that cluster's rows (source name → rows,
    as in :class:`ClassClusters`) held in worker memory (a persisted ``dask.delayed``; on
    ``client`` when given, each task retried up to twice).

    ``sources``: name → (N, p) dask array of rows; ``cluster_on`` names the one k-means reads.
    The tasks' keys are random (``pure=False``): a key hashed from their arguments, the private
    class labels among them, would let whoever sees the keys confirm a guess of a label.
    Seeds and rules are the Zarr route's (:func:`~kahm_dask.pipeline.training.partition.partition_classes`):
    class code c uses ``child(seed, c)``. ``partition``: (N,) caller labels instead of k-means.
    """
    classes = tuple(c for c, _, _ in layout.bounds)
    pieces: dict[int, dict[str, list]] = {c: {name: [] for name in sources} for c in classes}
    for name, X in sources.items():
        X = X.rechunk({1: -1})
        offsets = np.cumsum((0, *X.chunks[0]))
        for i, block in enumerate(X.to_delayed().ravel()):
            codes = y_codes[offsets[i]:offsets[i + 1]]
            split = dask.delayed(_split_by_class, pure=False, nout=len(classes))(block, codes, classes)
            for k, c in enumerate(classes):
                pieces[c][name].append(split[k])
    mcs = min_cluster_size or default_min_cluster_size(n_components)
    tasks = [
        dask.delayed(cluster_class, pure=False)(
            pieces[c], cluster_on, n_branches(b - a, block_size, s_rule), mcs, child_seed_sequence(seed, c), n_init,
            kmeans_dims, max_cluster_rows, None if partition is None else partition[layout.order[a:b]],
        )
        for c, a, b in layout.bounds
    ]
    held = client.persist(tasks, retries=2) if client is not None else dask.persist(*tasks)
    found = dask.compute(*[h.labels for h in held]) if client is None else client.gather(
        client.compute([h.labels for h in held], retries=2))
    labels = np.empty(len(y_codes), dtype=np.int64)
    for (_, a, b), part in zip(layout.bounds, found, strict=True):
        labels[layout.order[a:b]] = part
    # one held result per cluster, in memory before this returns, so that a cluster task depends
    # on nothing still to run and the tasks start in the order of their priorities
    keys = [(c, int(s)) for c, part in zip(classes, found, strict=True) for s in np.unique(part)]
    pick = {c: h.rows for c, h in zip(classes, held, strict=True)}
    rows = [pick[c][s] for c, s in keys]
    if client is not None:
        from distributed import futures_of, wait

        rows = client.persist(rows, retries=2)
        wait(futures_of(rows))
    else:
        rows = dask.persist(*rows)
    return labels, dict(zip(keys, rows, strict=True))
