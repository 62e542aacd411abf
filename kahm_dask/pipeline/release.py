"""A DP data set from a dataset store, on Dask (``kahm-dask release``): one release of the
store's rows, written with their labels in the owner's raw units beside its statement.

The release is the training's (:func:`~kahm_dask.pipeline.training.release.begin_store_release`:
bounds, plan, the data set's ledger, spent before any noise is drawn). Then the workers draw and
write the rows; the client holds labels and part names only:

* ``dp_data="noisy"``: one task per row chunk of the store draws its noise
  (:func:`~kahm_dask.pipeline.training.release.noisy_array`), undoes the scaling
  (:func:`~kahm_dask.dp_dataset.raw_units`) and writes its part; rows keep the store's order;
* ``dp_data="fabricated"``: one task per class reads the class's rows, draws their noise and
  fabricates them (:func:`~kahm_dask.dp_dataset.fabricate_class`, ``KAHMClassifier``'s partition
  and smoother): a class must fit one task's memory. Rows come class by class, in the store's
  order within each class.

Formats (:data:`FORMATS`): ``parquet``, a folder of part files (``part-00000.parquet`` …, one
per task; ``pandas.read_parquet(OUT)`` reads them as one table); ``csv``, one file (the parts are
joined on the client one at a time: for small data); ``zarr``, a kahm-dask dataset store
(X in raw units, y, the public raw bounds as its feature range), which ``kahm-dask train`` reads.
The statement is ``OUT.PRIVACY.md``. Nothing is written before the release is paid for, and an
existing OUT (or statement) is refused before anything is spent.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import dask
import dask.array as da
import numpy as np

from kahm_dask.dp_dataset import LABEL_COLUMN, column_names, fabricate_class, raw_units, release_markdown
from kahm_dask.pipeline.stores.dataset import DatasetStore, write_dataset
from kahm_dask.pipeline.training.release import begin_store_release, noisy_array
from kahm_dask.pipeline.training.settings import TrainSettings
from kahm_dask.privacy.randomness import as_noise_source

__all__ = ["FORMATS", "statement_path", "check_release_target", "earlier_release", "release_store", "to_raw_units",
           "read_release"]

#: What ``kahm-dask release`` writes.
FORMATS = ("parquet", "csv", "zarr")


def statement_path(out: Path) -> Path:
    """Where the statement of a release written to ``out`` goes: ``OUT.PRIVACY.md``."""
    return out.with_name(out.name + ".PRIVACY.md")


def check_release_target(out, fmt: str) -> Path:
    """``out`` as a local path a release in ``fmt`` can be written to: a known format, a local
    path, in an existing folder, with neither it nor its statement there (a release is never
    overwritten: its statement would no longer describe it). Raises before anything is spent."""
    if fmt not in FORMATS:
        raise ValueError(f"cannot write format {fmt!r}; choose one of {', '.join(FORMATS)}.")
    if not isinstance(out, Path):
        raise ValueError(f"{out}: a release is written to a local path (copy it to an object store after).")
    for path in (out, statement_path(out)):
        if path.exists() or path.is_symlink():
            raise FileExistsError(f"{path} exists; a release is never overwritten: choose another path.")
    if not out.parent.is_dir():
        raise FileNotFoundError(f"{out.parent} is not a folder; create it first.")
    return out


def earlier_release(store: DatasetStore, out: Path, settings: TrainSettings) -> dict | None:
    """The release this command already wrote to ``out``, as ``store`` remembers it (a dict of
    ``release_id``, ``epsilon``, ``delta``, ``time``, ``what``, ``ledger``), or None.

    A rerun of ``kahm-dask release``: ``out`` and its statement exist, the statement's release
    id is one that ``store`` remembers as written to ``out`` with the same ``dp_data``, ε (per
    entry) and δ as ``settings`` (solved for ``store``'s features). Anything else is None, and
    :func:`check_release_target` then refuses ``out`` (a release is never overwritten)."""
    statement = statement_path(out)
    if not (out.exists() and statement.is_file()):
        return None
    first = statement.read_text(encoding="utf-8").split("\n", 1)[0]
    if not first.startswith("# DP release "):
        return None
    release_id = first.removeprefix("# DP release ").strip()
    for entry in store.releases:
        what = str(entry.get("what", ""))
        if (entry.get("release_id") == release_id and what.startswith(f"{settings.params.dp_data} DP data set")
                and what.endswith(f"written to {out}") and entry.get("epsilon") == settings.params.epsilon
                and entry.get("delta") == settings.delta):
            return entry
    return None


def release_store(store: DatasetStore, out: Path, settings: TrainSettings, *, fmt: str = "parquet",
                  feature_names=None) -> dict:
    """Release the rows of ``store`` once with ``settings`` (``settings.params.dp_data``: noisy
    or fabricated) and write them, with their labels, in raw units to ``out`` in ``fmt``, and the
    statement to ``OUT.PRIVACY.md``, on the current Dask scheduler. Returns the summary: release
    id, rows, ledger and the statement (dict)."""
    check_release_target(out, fmt)
    names = column_names(feature_names, store.n_features)
    X = store.X()
    dp_data = settings.params.dp_data
    store.verified_fingerprint()  # every chunk readable and unchanged, before anything is spent
    release = begin_store_release(
        store, X, settings,
        what=f"{dp_data} DP data set ({store.n_samples} x {store.n_features}, unit: one entry) of "
             f"{store.location}, written to {out}",
        details={"data_store": str(store.location), "release": str(out), "format": fmt},
        stacklevel=3,
    )
    mech, scaling = release.mechanism, _scaling(store, release)
    source = as_noise_source(settings.insecure_noise_seed)
    if dp_data == "noisy":
        rows = noisy_array(X, mech, source)  # in the store's dtype: float32 rows stay float32
        codes = store.y()
    else:
        rows, codes = _fabricated(store, settings, mech, source)
    raw = rows.map_blocks(_in_raw_units, mech.lower, mech.upper, scaling, dtype=rows.dtype)
    labels = np.asarray(store.classes)[codes]
    raw_bounds = (mech.lower, mech.upper) if scaling is None else (scaling.raw_lower, scaling.raw_upper)
    if fmt == "zarr":
        write_dataset(out, raw, labels, chunk_rows=max(raw.chunks[0]), dtype=raw.dtype.name,
                      feature_range=raw_bounds, source=f"DP release {release.release_id}")
    else:
        _write_table(raw, labels, names, out, fmt)
    statement_path(out).write_text(release_markdown(release.statement, release.release_id, raw.shape))
    return {"release": str(out), "statement": str(statement_path(out)), "release_id": release.release_id,
            "dp_data": dp_data, "format": fmt, "n_rows": int(raw.shape[0]), "n_features": int(raw.shape[1]),
            "ledger_path": None if release.ledger is None else str(release.ledger.path),
            "bounds": [mech.lower.tolist(), mech.upper.tolist()],
            "raw_bounds": [np.asarray(b).tolist() for b in raw_bounds],
            "scaling": None if scaling is None else scaling.describe(),
            "privacy_statement": release.statement.to_dict()}


def to_raw_units(summary: dict):
    """The map of feature-unit rows (n, p) to the raw units of the release ``summary`` (of
    :func:`release_store`): :func:`~kahm_dask.dp_dataset.raw_units` with its bounds and scaling."""
    from kahm_dask.privacy.bounds import Scaling

    lower, upper = (np.asarray(b) for b in summary["bounds"])
    scaling = None if summary["scaling"] is None else Scaling(**summary["scaling"])
    return lambda X: raw_units(X, lower, upper, scaling)


def read_release(out: Path, fmt: str):
    """A written release as one DataFrame: the features (raw units) and :data:`LABEL_COLUMN`."""
    import pandas as pd

    if fmt == "parquet":
        return pd.read_parquet(out)
    if fmt == "csv":
        return pd.read_csv(out)
    from kahm_dask.pipeline.stores.dataset import open_dataset

    ds = open_dataset(out)
    frame = pd.DataFrame(np.asarray(ds.X()), columns=list(column_names(None, ds.n_features)))
    frame[LABEL_COLUMN] = ds.labels()
    return frame


def _scaling(store: DatasetStore, release):
    """The scaling of the release's features (from the bounds it was planned with), if known."""
    from kahm_dask.privacy.bounds import Scaling

    raw = release.statement.raw
    if raw is None:
        return None
    return Scaling(raw["kind"], np.broadcast_to(raw["raw_lower"], (store.n_features,)),
                   np.broadcast_to(raw["raw_upper"], (store.n_features,)))


#: Rows converted to raw units at once: the float64 working copies of a block stay small.
RAW_UNIT_ROWS = 256


def _in_raw_units(rows: np.ndarray, lower: np.ndarray, upper: np.ndarray, scaling) -> np.ndarray:
    """One block of DP rows in raw units (:func:`~kahm_dask.dp_dataset.raw_units`), in its dtype,
    :data:`RAW_UNIT_ROWS` rows at a time (a worker holds the block twice, not its float64 copies)."""
    out = np.empty_like(rows)
    for start in range(0, rows.shape[0], RAW_UNIT_ROWS):
        part = slice(start, start + RAW_UNIT_ROWS)
        out[part] = raw_units(rows[part], lower, upper, scaling)
    return out


def _fabricated(store: DatasetStore, settings: TrainSettings, mech, source) -> tuple[da.Array, np.ndarray]:
    """The fabricated rows, one task (one block) per class, and their class codes (class by
    class)."""
    from kahm_dask.classifier import KAHMClassifier

    spec = KAHMClassifier(**{k: v for k, v in settings.to_params().items()
                             if k in KAHMClassifier._parameter_constraints})
    if spec._set_entry_epsilon(store.n_features) != mech.epsilon:  # as a fit sets it: the release's ε per entry
        raise RuntimeError(f"the fabrication's ε per entry {spec.epsilon_} is not the release's {mech.epsilon}.")
    private = settings.needs_private_rows
    blocks, codes = [], []
    for code in range(len(store.classes)):
        at = store.class_rows(code)
        task = dask.delayed(_fabricate_task, pure=False)(store, at, spec, code, mech, source, private)
        blocks.append(da.from_delayed(task, shape=(at.size, store.n_features), dtype=np.float64))
        codes.append(np.full(at.size, code))
    return da.concatenate(blocks), np.concatenate(codes)


def _fabricate_task(store: DatasetStore, at: np.ndarray, spec, code: int, mech, source, private: bool) -> np.ndarray:
    """One class: its rows (read on the worker), their noise, their fabricated rows."""
    X_c = store.read_rows(at)
    noisy = mech.release(X_c, source, dtype=np.float64)
    return fabricate_class(spec, X_c if private else None, noisy, code)


def _write_table(raw: da.Array, labels: np.ndarray, names: tuple[str, ...], out: Path, fmt: str) -> None:
    """Parquet parts in the folder ``out``, or one CSV file ``out``: each block written by its
    task; a CSV's parts are then joined on the client, one part in memory at a time."""
    parts = out if fmt == "parquet" else out.with_name(f".{out.name}.parts")
    parts.mkdir()
    try:
        starts = np.concatenate([[0], np.cumsum(raw.chunks[0])])
        raw = raw.rechunk({1: -1})
        tasks = [dask.delayed(_write_part)(block, labels[starts[i]:starts[i + 1]], names,
                                           parts / f"part-{i:05d}.{fmt}", fmt)
                 for i, block in enumerate(raw.to_delayed().ravel())]
        written = dask.compute(*tasks)
        if fmt == "csv":
            with open(out, "wb") as joined:
                for i, part in enumerate(written):
                    with open(part, "rb") as fh:
                        if i:
                            fh.readline()  # the header, once
                        shutil.copyfileobj(fh, joined)
    except BaseException:
        shutil.rmtree(parts, ignore_errors=True)
        if fmt == "csv":
            out.unlink(missing_ok=True)
        raise
    if fmt == "csv":
        shutil.rmtree(parts)


def _write_part(block: np.ndarray, labels: np.ndarray, names: tuple[str, ...], path: Path, fmt: str) -> Path:
    """One part: the rows ``block`` (n, p) with their ``labels`` (n,) as a table at ``path``.

    Parquet is written by pyarrow from the columns of one transposed copy, without dictionary
    encoding: on 2048 × 4096 clipped float32 noisy rows that took 0.95 s a part, against 1.6 s
    with a dictionary tried for every column (pandas' and pyarrow's default), for 7 % fewer bytes."""
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        columns = np.ascontiguousarray(block.T)
        table = pa.Table.from_arrays([*columns, pa.array(labels)], names=[*names, LABEL_COLUMN])
        pq.write_table(table, path, use_dictionary=False)
    else:
        import pandas as pd

        frame = pd.DataFrame(block, columns=list(names))
        frame[LABEL_COLUMN] = labels
        frame.to_csv(path, index=False)
    return path
