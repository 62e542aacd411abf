"""What happens at one site of a federated run (docs/federated.md): its private store, its
training run, its answers (rho_q, c_q) to the coordinator's queries and its membership report.
With ``pin`` every task of site q carries the worker resource ``site{q}``: it runs only on the
workers that hold site q (:func:`kahm_dask.pipeline.cluster.sites.pinned`). What leaves a site:
its answer store and the few scalars of its membership summary.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import zarr
from distributed import Client

from kahm_dask._validation import site_fit
from kahm_dask.federated import site_answer
from kahm_dask.pipeline.cluster import compute
from kahm_dask.pipeline.cluster.progress import Progress
from kahm_dask.pipeline.cluster.sites import pinned
from kahm_dask.pipeline.predict import class_distance_array
from kahm_dask.pipeline.runs.central import member_rows, membership_metrics
from kahm_dask.pipeline.runs.layout import FederationPaths, RunPaths
from kahm_dask.pipeline.stores.dataset import DatasetStore, open_dataset, write_dataset
from kahm_dask.pipeline.stores.manifest import read_manifest
from kahm_dask.pipeline.training import TrainSettings, train_pipeline
from kahm_dask.storage.atomic import atomic_directory, write_json_atomic
from kahm_dask.storage.private import private_directory

__all__ = ["LABEL", "MIN_DISTANCE", "SITE", "outside_the_sites", "write_site_stores",
           "train_site", "site_answer_arrays", "store_arrays", "answer_to_store", "site_membership"]


# array names of the answer stores and of predictions.zarr (a FederatedDecision)
LABEL, MIN_DISTANCE, SITE = "label", "min_distance", "site"


@contextmanager
def outside_the_sites(local: bool) -> Iterator[None]:
    """Run the dask computations inside on local threads of the client process (``local``),
    not on the cluster: no site's worker touches what is computed here."""
    if not local:
        yield
        return
    with dask.config.set(scheduler="threads"):
        yield


def write_site_stores(
    train: DatasetStore, sites: list[np.ndarray], layout: FederationPaths, record: dict, *, pin: bool = False,
) -> list[DatasetStore]:
    """Write site q's private store (``layout.site(q).train_store``) with the pooled training
    rows ``sites[q]`` (and the pooled store's public feature range).

    The pooled store stands for rows that are never in one place in a real federation: with
    ``pin`` the split runs in the client process (local threads), so no site's worker reads a
    chunk of the pooled store (which holds other sites' rows). ``record`` (the split) is kept
    in ``layout.split_record``; a rerun reuses the
    stores of the same split (resume) and refuses a directory that holds another split.
    """
    record_path = layout.split_record
    if record_path.exists() and json.loads(record_path.read_text()) != record:
        raise ValueError(
            f"{record_path.parent.parent} holds site stores of a different split; use a new "
            "output directory (or delete it) to run this federation."
        )
    write_json_atomic(record_path, record)
    fr = train.attrs.get("feature_range")
    feature_range = None if not fr else (fr["min"], fr["max"])
    X, labels = train.X(), train.labels()
    stores = []
    for q, rows in enumerate(sites):
        path = layout.site(q).train_store
        if path.exists():
            stores.append(open_dataset(path))
            continue
        private_directory(path.parent)
        with outside_the_sites(pin):
            stores.append(write_dataset(path, X[rows], labels[rows], source=f"site{q}",
                                        feature_range=feature_range))
    return stores


def train_site(
    q: int,
    store: DatasetStore,
    directory: Path | RunPaths,
    settings: TrainSettings,
    client: Client | None,
    *,
    partition: np.ndarray | None = None,
    pin: bool = False,
    progress: Progress | bool = False,
) -> dict:
    """Train site q's model store from its store; with ``pin`` every task carries the resource
    ``site{q}``. ``directory``: the site's :class:`~kahm_dask.pipeline.runs.layout.RunPaths` (model
    store ``public/model.zarr`` for a DP site, work store ``owner/work``), or a plain
    directory (``directory/model.zarr``, ``directory/work``)."""
    if isinstance(directory, RunPaths):
        model, work = directory.model, directory.work
    else:
        model, work = Path(directory) / "model.zarr", Path(directory) / "work"
    with pinned(q, pin), site_fit():  # a site may hold one class
        return train_pipeline(store, model, work, settings, client, partition=partition,
                              progress=progress)


def _answer_block(D: np.ndarray, table: np.ndarray, part: str) -> np.ndarray:
    """One field of the site's answer (:func:`kahm_dask.federated.site_answer`) on a block of its
    (m_b, C_q) class distances, its labels as codes into the pooled classes (``table``)."""
    return getattr(site_answer(D, table), part)


def site_answer_arrays(
    model_path: Path, X: da.Array, classes: Sequence[Any], *, n_probe: int | None = None,
    eval_dtype: str = "float64",
) -> tuple[da.Array, da.Array]:
    """Lazy ``(ρ_q, ĉ_q)`` of one site for the rows of X (m, p): min and argmin over the
    site's classes of its (m, C_q) class distances (routed with ``n_probe``,
    docs/algorithm.md#routing; kernel blocks in ``eval_dtype``,
    docs/algorithm.md#evaluation-precision); both (m,), ĉ_q as a code into ``classes`` (the
    pooled class labels)."""
    site_classes = read_manifest(model_path)["classes"]
    index = {label: code for code, label in enumerate(classes)}
    table = np.array([index[label] for label in site_classes], dtype=np.int64)
    D = class_distance_array(model_path, X, n_probe=n_probe, eval_dtype=eval_dtype)  # (m, C_q), stays at the site
    D = D.rechunk({1: -1})  # all of the site's classes in each block
    parts = {"min_distance": np.float64, "label": np.int64}
    rho, code = (da.map_blocks(_answer_block, D, table, part, drop_axis=1, dtype=dtype, meta=np.empty((0,), dtype))
                 for part, dtype in parts.items())
    return rho, code


def store_arrays(
    arrays: dict[str, da.Array], path: Path, client: Client | None, attrs: dict | None = None
) -> None:
    """Write (m,) dask arrays (one task per row chunk) and the attributes ``attrs`` into a new
    Zarr group that replaces ``path`` atomically once complete."""
    with atomic_directory(path) as tmp:
        group = zarr.open_group(str(tmp), mode="w", zarr_format=3)
        targets = [
            group.create_array(name, shape=a.shape, dtype=a.dtype, chunks=(a.chunks[0][0],))
            for name, a in arrays.items()
        ]
        compute(da.store(list(arrays.values()), targets, lock=False, compute=False), client)
        if attrs:
            group.attrs.update(attrs)


def answer_to_store(
    q: int, model_path: Path, X: da.Array, classes: Sequence[Any], path: Path,
    client: Client | None, *, pin: bool = False, n_probe: int | None = None, eval_dtype: str = "float64",
) -> Path:
    """Site q answers the queries X (m, p): ``(ρ_q, ĉ_q)`` into the Zarr group ``path``
    (arrays ``min_distance`` and ``label``), its only output. With ``pin`` all of it runs on
    the workers with resource ``site{q}``. One graph per site: the model stores of all sites
    name their layers alike (``kahm-home-…``). X are queries (the coordinator's test
    rows), sent to every site: never pass a site's training rows here."""
    with pinned(q, pin):
        rho, code = site_answer_arrays(model_path, X, classes, n_probe=n_probe, eval_dtype=eval_dtype)
        store_arrays({MIN_DISTANCE: rho, LABEL: code}, path, client)
    return Path(path)


def _site_membership_task(d_train: np.ndarray, d_test: np.ndarray, seed: int, path: str) -> dict:
    """At the site: the membership report from its members' and the queries' distances,
    written to the site's owner folder; returns only the summary fields."""
    fields = membership_metrics(d_train, d_test, seed)
    write_json_atomic(path, {**fields, "n_test": int(np.size(d_test))}, indent=2, default=float)
    return fields


def site_membership(
    q: int, store: DatasetStore, model_path: Path, test_answers: Path, out_path: Path,
    client: Client | None, *, max_train_rows: int | None = None, seed: int = 0,
    pin: bool = False, n_probe: int | None = None, eval_dtype: str = "float64",
) -> dict:
    """Site q's membership report, computed at site q: its model's distances ρ_q of its own
    training rows (``store``; a seeded subset of ``max_train_rows``; computed as the answers,
    with ``n_probe`` and ``eval_dtype``) against its answers to
    the shared queries (``test_answers``), written to ``out_path`` (site q's owner folder).

    Returns only the summary fields (:func:`~kahm_dask.pipeline.runs.central.membership_metrics`). With
    ``pin`` every task (reading the rows, the distances, the metrics) runs on site q's
    workers; the member distances never leave them. Equal to
    :func:`kahm_dask.federated.site_membership_evaluation` with ``random_state=seed``.
    """
    with pinned(q, pin):
        X = member_rows(store, max_train_rows, seed)  # built here: reads carry site q's resource
        d_train = class_distance_array(model_path, X, n_probe=n_probe, eval_dtype=eval_dtype).min(axis=1)
        d_test = da.from_zarr(str(test_answers), component=MIN_DISTANCE)
        job = dask.delayed(_site_membership_task, pure=False)(d_train, d_test, seed, str(out_path))
        return compute(job, client)
