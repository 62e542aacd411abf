"""A pickled DaskKAHMClassifier travels: fitted without ``store_dir``, its pickle carries the model
store (the fitting process's temporary directory may be gone) and a fresh process predicts the
same with or without a client; with ``store_dir`` it names the store and stays small. The copies'
temporary directories are deleted with them, and a DP model's pickle carries its model store's
files only (not the training rows, the work store or the rows' private fingerprint).
"""

from __future__ import annotations

import copy
import gc
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import joblib
import numpy as np
import pytest

from kahm_dask import DaskKAHMClassifier
from kahm_dask.pipeline.estimator.stores import MODEL
from kahm_dask.pipeline.stores.dataset import open_dataset

ROOT = Path(__file__).parents[3]
SEED = 0

#: Unpickle argv[1] (pickle or joblib), predict the rows of argv[2], print the predictions and
#: where the copy's model store was; argv[3] == "client": on a LocalCluster of one worker process.
_PREDICT = """
import json, pickle, sys
import joblib, numpy as np

def main():
    path, rows, mode = sys.argv[1:]
    est = joblib.load(path) if path.endswith(".joblib") else pickle.load(open(path, "rb"))
    X = np.load(rows)
    if mode == "client":
        from distributed import Client, LocalCluster
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as c, \\
                Client(c) as client:
            pred = est.predict(X)
            ran = c.scheduler.transition_counter > 0
    else:
        pred, ran = est.predict(X), None
    print(json.dumps({"pred": pred.tolist(), "store": str(est.model_path_), "on_cluster": ran}))

if __name__ == "__main__":
    main()
"""


def _small(digits, classes: int = 3):
    keep = digits.y_train < classes
    return digits.X_train[keep], digits.y_train[keep], digits.X_test[digits.y_test < classes]


def _in_fresh_process(path: Path, rows: Path, mode: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", _PREDICT, str(path), str(rows), mode], capture_output=True,
                         text=True, timeout=300, cwd=ROOT, env=env, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def pickled(client, digits, tmp_path_factory) -> tuple[Path, np.ndarray]:
    """A model fitted without ``store_dir``, pickled and joblib-dumped into a folder with its
    test rows (rows.npy), then deleted with its temporary directory; and its predictions."""
    X, y, X_test = _small(digits)
    folder = tmp_path_factory.mktemp("pickled")
    est = DaskKAHMClassifier(random_state=SEED).fit(X, y)
    expected = est.predict(X_test)
    temporary = est.model_path_.parent
    (folder / "model.pkl").write_bytes(pickle.dumps(est))
    joblib.dump(est, folder / "model.joblib")
    np.save(folder / "rows.npy", X_test)
    del est
    gc.collect()
    assert not temporary.exists()  # the fitting estimator took its directory with it
    return folder, expected


@pytest.mark.parametrize("dump, mode", [("model.pkl", "none"), ("model.joblib", "client")])
def test_a_pickle_of_a_temporary_store_predicts_in_a_fresh_process(pickled, dump, mode):
    folder, expected = pickled
    result = _in_fresh_process(folder / dump, folder / "rows.npy", mode)
    np.testing.assert_array_equal(result["pred"], expected)
    assert not Path(result["store"]).parent.exists()  # the copy's directory left with its process
    assert result["on_cluster"] is (True if mode == "client" else None)


def test_copies_own_their_stores_and_a_persistent_store_is_named(client, digits, tmp_path):
    X, y, X_test = _small(digits)
    est = DaskKAHMClassifier(random_state=SEED).fit(X, y)
    twin = copy.deepcopy(est)
    assert twin.model_path_.parent != est.model_path_.parent and twin.model_path_.name == MODEL
    np.testing.assert_array_equal(twin.predict(X_test), est.predict(X_test))
    again = pickle.loads(pickle.dumps(twin))  # a copy pickles its own copy of the store
    np.testing.assert_array_equal(again.predict(X_test), est.predict(X_test))
    copied = twin.model_path_.parent
    twin.fit(X, y)  # a refit replaces the copy's directory with a new one
    assert not copied.exists() and twin.model_path_.parent.exists()
    kept = twin.model_path_.parent
    del twin
    gc.collect()
    assert not kept.exists() and est.model_path_.exists()

    named = DaskKAHMClassifier(random_state=SEED, store_dir=tmp_path / "stores").fit(X, y)
    blob = pickle.dumps(named)
    assert len(blob) < 10_000  # the parameters and the store's path, not the store
    assert pickle.loads(blob).model_path_ == named.model_path_


def test_a_dp_pickle_carries_the_model_store_only(client, digits):
    X, y, _ = _small(digits)
    with pytest.warns(Warning):  # the test-only noise seed
        est = DaskKAHMClassifier(random_state=SEED, epsilon=1.0, bounds=(0.0, 1.0), insecure_noise_seed=1).fit(X, y)
    state = est.__getstate__()
    model = est.model_path_
    carried = state["_model_store_files"]
    on_disk = {f.relative_to(model).as_posix() for f in model.rglob("*") if f.is_file()}
    assert set(carried) == on_disk and "zarr.json" in carried
    assert all(carried[name] == (model / name).read_bytes() for name in carried)
    fingerprint = open_dataset(model.parent / "train.zarr").fingerprint()
    blob = pickle.dumps(est)
    assert fingerprint.rows.encode() not in blob and fingerprint.order.encode() not in blob
    rows = [f for f in (model.parent / "train.zarr" / "X").rglob("*") if f.is_file() and f.name != "zarr.json"]
    assert rows and not any(f.read_bytes() in blob for f in rows)  # the training rows' chunks
