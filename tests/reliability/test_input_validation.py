"""Bad input, wherever data enter: the estimator, the store, the pipeline YAML, the CLI and the
pipeline functions (docs/reliability.md §1).

Every case is one row of a table: what is fed in, the exception, a pattern that must name the
problem and, where the message can carry one, a pattern naming the fix.
Duplicate rows and constant features are not errors: they must train (λ* > 0 keeps
K + λ*I positive definite).
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import dask.array as da
import numpy as np
import pytest
from click.testing import CliRunner

from kahm_dask import KAHMClassifier
from kahm_dask._validation import (
    check_class_sizes,
    check_finite_rows,
    check_label_types,
    check_n_components,
)
from kahm_dask.cli import main
from kahm_dask.pipeline.config import ConfigError, load_config
from kahm_dask.pipeline.predict import DISTANCES, PREDICTIONS, class_distance_array, predict_to_store
from kahm_dask.pipeline.stores.dataset import ingest, open_dataset, write_dataset
from kahm_dask.pipeline.training import TrainSettings, train_pipeline
from kahm_dask.recipe import TrainParams

RNG = np.random.default_rng(0)
X = RNG.random((40, 5))
Y = np.repeat([0, 1], 20)


def _with(value, row=3, col=2):
    out = X.copy()
    out[row, col] = value
    return out


def _clf(**kw) -> KAHMClassifier:
    return KAHMClassifier(n_components=3, n_layers=2, random_state=0, **kw)


@pytest.fixture(scope="module")
def fitted() -> KAHMClassifier:
    return _clf().fit(X, Y)


@dataclass(frozen=True)
class Case:
    """``call(ctx)`` must raise ``exc`` with a message matching ``problem`` (and ``fix``)."""

    call: Callable
    exc: type[BaseException] | tuple[type[BaseException], ...]
    problem: str
    fix: str | None = None


def _check(case: Case, ctx) -> None:
    with pytest.raises(case.exc) as info:
        case.call(ctx)
    message = str(info.value)
    assert re.search(case.problem, message, re.I), f"problem not named in: {message}"
    if case.fix is not None:
        assert re.search(case.fix, message, re.I), f"fix not named in: {message}"


# --------------------------------------------------------------------------- the estimator

EPSILON_RULE = r"'epsilon' parameter of KAHMClassifier must be None or a finite float > 0 \(at least 2\.8e-13\)"
ESTIMATOR = {
    "nan": Case(lambda f: _clf().fit(_with(np.nan), Y), ValueError, r"contains NaN", r"imput"),
    "inf": Case(lambda f: _clf().fit(_with(np.inf), Y), ValueError, r"infinity"),
    "-inf": Case(lambda f: _clf().fit(_with(-np.inf), Y), ValueError, r"infinity"),
    "rank 1": Case(lambda f: _clf().fit(X[:, 0], Y), ValueError, r"Expected 2D array", r"reshape"),
    "rank 3": Case(lambda f: _clf().fit(X[:, :, None], Y), ValueError, r"dim 3.*dim <= 2"),
    "empty": Case(lambda f: _clf().fit(X[:0], Y[:0]), ValueError, r"0 sample\(s\).*minimum of 2"),
    "single-row class": Case(lambda f: _clf().fit(X[:21], Y[:21]), ValueError, r"\[1\] have 1 sample",
                             r"at least 2 samples per class"),
    "X/y lengths": Case(lambda f: _clf().fit(X, Y[:-1]), ValueError, r"inconsistent numbers of samples"),
    "continuous labels": Case(lambda f: _clf().fit(X, RNG.random(40)), ValueError,
                              r"Unknown label type: continuous"),
    "predict: feature count": Case(lambda f: f.predict(X[:, :4]), ValueError,
                                   r"X has 4 features, but KAHMClassifier is expecting 5 features"),
    "predict: nan": Case(lambda f: f.predict(_with(np.nan)), ValueError, r"contains NaN", r"imput"),
    "predict: inf": Case(lambda f: f.predict(_with(np.inf)), ValueError, r"infinity"),
    "predict: rank 1": Case(lambda f: f.predict(X[0]), ValueError, r"Expected 2D array", r"reshape"),
    "predict: unfitted": Case(lambda f: _clf().predict(X), Exception, r"not fitted", r"call 'fit'"),
    "epsilon = 0": Case(lambda f: _clf(epsilon=0.0).fit(X, Y), ValueError,
                        EPSILON_RULE + r"\. Got 0\.0"),
    "epsilon < 0": Case(lambda f: _clf(epsilon=-1.0).fit(X, Y), ValueError,
                        EPSILON_RULE + r"\. Got -1\.0"),
    "epsilon nan": Case(lambda f: _clf(epsilon=np.nan).fit(X, Y), ValueError,
                        EPSILON_RULE + r"\. Got nan"),
    "epsilon inf": Case(lambda f: _clf(epsilon=np.inf).fit(X, Y), ValueError,
                        EPSILON_RULE + r"\. Got inf"),
    "epsilon str": Case(lambda f: _clf(epsilon="2").fit(X, Y), TypeError,
                        EPSILON_RULE + r"\. Got '2'"),
    "delta = 1": Case(lambda f: _clf(epsilon=1.0, delta=1.0).fit(X, Y), ValueError,
                      r"'delta' parameter of KAHMClassifier must be a float >= 0 and < 1\. Got 1\.0"),
    "delta < 0": Case(lambda f: _clf(epsilon=1.0, delta=-0.1).fit(X, Y), ValueError,
                      r"'delta' parameter of KAHMClassifier must be a float >= 0 and < 1\. Got -0\.1"),
    "delta > 1": Case(lambda f: _clf(epsilon=1.0, delta=1.5).fit(X, Y), ValueError,
                      r"'delta' parameter of KAHMClassifier must be a float >= 0 and < 1\. Got 1\.5"),
    "d = 0": Case(lambda f: _clf(epsilon=1.0, d=0.0).fit(X, Y), ValueError,
                  r"'d' parameter of KAHMClassifier must be None, a finite float > 0 or an array-like\. Got 0\.0"),
    "d < 0": Case(lambda f: _clf(epsilon=1.0, d=-1.0).fit(X, Y), ValueError,
                  r"'d' parameter of KAHMClassifier must be None, a finite float > 0 or an array-like\. Got -1\.0"),
    "n_components = 0": Case(lambda f: KAHMClassifier(n_components=0).fit(X, Y), ValueError,
                             r"'n_components' parameter of KAHMClassifier must be an int >= 1\. Got 0"),
    "n_layers = 0": Case(lambda f: KAHMClassifier(n_layers=0).fit(X, Y), ValueError,
                         r"'n_layers' parameter of KAHMClassifier must be an int >= 1\. Got 0"),
    "block_size = 0": Case(lambda f: KAHMClassifier(block_size=0).fit(X, Y), ValueError,
                           r"'block_size' parameter of KAHMClassifier must be an int >= 1\. Got 0"),
    "dp_data unknown": Case(lambda f: _clf(epsilon=1.0, dp_data="raw").fit(X, Y), ValueError,
                            r"'dp_data' parameter of KAHMClassifier must be one of 'fabricated', 'noisy'\. Got 'raw'"),
}

MIXED_LIST = [0] * 20 + ["a"] * 20
ESTIMATOR.update({
    # np.asarray would turn these into the strings '0' and 'a' (the model would then predict
    # '0' for label 0), or scikit-learn's 'Unknown label type: unknown' (naming neither).
    "mixed label types (list)": Case(lambda f: _clf().fit(X, MIXED_LIST), ValueError,
                                     r"mixes label types", r"astype\(str\)"),
    "mixed label types (object array)": Case(
        lambda f: _clf().fit(X, np.array(MIXED_LIST, dtype=object)), ValueError,
        r"mixes label types", r"astype\(str\)"),
})


@pytest.mark.parametrize("case", list(ESTIMATOR.values()), ids=list(ESTIMATOR))
def test_estimator_rejects(case, fitted):
    _check(case, fitted)


def test_estimator_warns_when_n_components_exceeds_features():
    with pytest.warns(UserWarning, match=r"n_components=20 exceeds the number of features \(5\)"):
        KAHMClassifier(n_components=20, n_layers=2, random_state=0).fit(X, Y)


def test_n_components_above_features_is_capped_and_trains():
    clf = KAHMClassifier(n_components=20, n_layers=2, random_state=0).fit(X, Y)
    dims = [d for m in clf.models_ for b in m.branches_ for d in b.layer_dims_]
    assert max(dims) <= X.shape[1]
    assert np.isfinite(clf.class_distances(X)).all()


# --------------------------------------------------------------------------- degenerate data


def _blobs(n_per_class=30, p=6, seed=1):
    rng = np.random.default_rng(seed)
    centres = np.array([[0.2] * p, [0.8] * p])
    Xb = np.vstack([c + 0.05 * rng.standard_normal((n_per_class, p)) for c in centres])
    return Xb, np.repeat([0, 1], n_per_class)


@pytest.mark.parametrize("epsilon", [None, 2.0])
def test_duplicate_rows_and_constant_features_train(epsilon):
    Xb, yb = _blobs()
    Xd = np.repeat(Xb[::3], 3, axis=0)  # every row three times
    Xd[:, 2] = 0.5  # a constant feature
    Xd[:, 4] = 0.0  # another one
    yd = np.repeat(yb[::3], 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no overflow, no division by zero
        clf = KAHMClassifier(n_components=4, n_layers=3, random_state=0, epsilon=epsilon).fit(Xd, yd)
        D = clf.class_distances(Xb)
    assert np.isfinite(D).all()
    if epsilon is None:
        assert np.mean(clf.predict(Xb) == yb) == 1.0
        for model in clf.models_:
            for branch in model.branches_:
                for layer in branch.layers_:  # K + λ*I is positive definite
                    assert layer.lambda_ > 0
                    assert layer.kernel_eigenvalues_.min() + layer.lambda_ > 0


def test_all_rows_of_a_class_identical_trains():
    Xb, yb = _blobs()
    # rank-0 class: its KAHM is the class mean (docs/decisions.md#decision-rank-zero)
    Xb[yb == 0] = 0.3
    clf = KAHMClassifier(n_components=4, n_layers=2, random_state=0).fit(Xb, yb)
    assert np.isfinite(clf.class_distances(Xb)).all()
    assert np.mean(clf.predict(Xb) == yb) == 1.0


def test_duplicate_rows_and_constant_features_through_the_pipeline(tmp_path):
    Xb, yb = _blobs(40)
    Xd = np.repeat(Xb[::2], 2, axis=0)
    Xd[:, 1] = 0.25
    yd = np.repeat(yb[::2], 2)
    store = write_dataset(tmp_path / "s.zarr", Xd, yd, chunk_rows=25)
    settings = TrainSettings(TrainParams(4, 3, epsilon=2.0, r_source="passes", r_value=3), seed=0)
    train_pipeline(store, tmp_path / "m.zarr", tmp_path / "w", settings, progress=False)
    D = class_distance_array(tmp_path / "m.zarr", da.from_array(Xb, chunks=(20, 6))).compute(scheduler="threads")
    assert np.isfinite(D).all() and D.shape == (80, 2)


# --------------------------------------------------------------------------- the dataset store

STORE = {
    "nan": Case(lambda t: write_dataset(t / "s", _with(np.nan), Y), ValueError,
                r"non-finite value at row 3, column 2: nan", r"remove or impute"),
    "inf": Case(lambda t: write_dataset(t / "s", _with(np.inf), Y), ValueError,
                r"non-finite value at row 3, column 2: inf", r"remove or impute"),
    "nan (dask)": Case(lambda t: write_dataset(t / "s", da.from_array(_with(np.nan), chunks=(10, 5)), Y),
                       ValueError, r"non-finite value at row 3, column 2", r"remove or impute"),
    "float32 overflow": Case(lambda t: write_dataset(t / "s", _with(1e300), Y, dtype="float32"), ValueError,
                             r"overflows float32", r"dtype='float64'"),
    "rank 1": Case(lambda t: write_dataset(t / "s", X[:, 0], Y), ValueError, r"must be 2-D", r"reshape"),
    "rank 3": Case(lambda t: write_dataset(t / "s", X[:, :, None], Y), ValueError, r"must be 2-D", r"reshape"),
    "empty": Case(lambda t: write_dataset(t / "s", X[:0], Y[:0]), ValueError, r"at least one row"),
    "X/y lengths": Case(lambda t: write_dataset(t / "s", X, Y[:-1]), ValueError, r"39 labels but X has 40 rows"),
    "mixed labels (list)": Case(lambda t: write_dataset(t / "s", X, MIXED_LIST), TypeError,
                                r"labels of type\(s\) int, str", r"astype\(str\)"),
    "mixed labels (object)": Case(lambda t: write_dataset(t / "s", X, np.array(MIXED_LIST, dtype=object)),
                                  TypeError, r"int, str", r"astype\(str\)"),
    "fractional labels": Case(lambda t: write_dataset(t / "s", X, RNG.random(40)), TypeError,
                              r"non-integer floats", r"integers or strings"),
    "2-D labels": Case(lambda t: write_dataset(t / "s", X, Y[:, None]), ValueError, r"y must be 1-D"),
    "string features": Case(lambda t: write_dataset(t / "s", X.astype(str), Y), TypeError, r"real numbers"),
    "existing path": Case(lambda t: write_dataset(write_dataset(t / "s", X, Y).path, X, Y), FileExistsError,
                          r"already exists", r"overwrite=True"),
    "csv nan": Case(lambda t: ingest(_csv(t, "1,2,3\n4,nan,0\n"), t / "s"), ValueError,
                    r"non-finite value at row 1, column 1", r"impute"),
    "csv text": Case(lambda t: ingest(_csv(t, "1,2,3\n4,abc,0\n"), t / "s"), ValueError,
                     r"Cannot parse .* as a numeric CSV"),
    "npz object labels": Case(lambda t: ingest(_npz(t), t / "s"), ValueError, r"Python object array",
                              r"astype\(str\)"),
    "missing file": Case(lambda t: ingest(t / "nope.csv", t / "s"), FileNotFoundError, r"not found"),
}


def _csv(tmp: Path, text: str) -> Path:
    path = tmp / "d.csv"
    path.write_text(text)
    return path


def _npz(tmp: Path) -> Path:
    path = tmp / "d.npz"
    np.savez(path, X=X, y=np.array(MIXED_LIST, dtype=object))
    return path


@pytest.mark.parametrize("name", list(STORE))
def test_store_rejects(name, tmp_path):
    _check(STORE[name], tmp_path)
    if name != "existing path":
        assert not (tmp_path / "s").exists(), "a failed ingest left a store behind"
    assert not list(tmp_path.glob("*.tmp-*")), "a failed ingest left a temporary store"


# --------------------------------------------------------------------------- the pipeline YAML

BASE_YAML = """\
name: t
output: {out}
data:
  source: sklearn:iris
"""

YAML = {
    "unknown top-level key": ("seeed: 3\n", r"unknown key 'seeed'.*did you mean 'seed'"),
    "unknown section key": ("model:\n  n_componets: 3\n",
                            r"unknown key 'model.n_componets'.*did you mean 'n_components'"),
    "unknown nested key": ("data:\n  source: synthetic:blobs\n  synthetic:\n    n_sampels: 10\n",
                           r"unknown key 'data.synthetic.n_sampels'"),
    "unknown section": ("privcy:\n  epsilon: 1.0\n", r"unknown key 'privcy'.*did you mean 'privacy'"),
    "epsilon = 0": ("privacy:\n  epsilon: 0\n", r"'privacy.epsilon'.*: must be > 0 \(at least 2\.8e-13\), got 0"),
    "epsilon < 0": ("privacy:\n  epsilon: -1.5\n", r"'privacy.epsilon'.*: must be > 0 \(at least 2\.8e-13\), got -1.5"),
    "epsilon nan": ("privacy:\n  epsilon: .nan\n", r"'privacy.epsilon'.*: must be a finite number"),
    "epsilon string": ("privacy:\n  epsilon: two\n", r"wrong type for 'privacy.epsilon'.*expected float or null"),
    "delta < 0": ("privacy:\n  epsilon: 1.0\n  delta: -0.1\n", r"'privacy.delta'.*: must be >= 0 and < 1, got -0.1"),
    "delta = 1": ("privacy:\n  epsilon: 1.0\n  delta: 1\n", r"'privacy.delta'.*: must be >= 0 and < 1, got 1"),
    "delta > 1": ("privacy:\n  epsilon: 1.0\n  delta: 2.5\n", r"'privacy.delta'.*: must be >= 0 and < 1"),
    "bounds not a pair": ("data:\n  source: sklearn:iris\n  bounds: [0]\n", r"'data.bounds'.*\[lower, upper\]"),
    "d = 0": ("privacy:\n  epsilon: 1.0\n  d: 0\n", r"'privacy.d'.*: must be > 0, got 0"),
    "d < 0": ("privacy:\n  epsilon: 1.0\n  d: -2\n", r"'privacy.d'.*: must be > 0"),
    "n_components = 0": ("model:\n  n_components: 0\n", r"'model.n_components'.*: must be >= 1, got 0"),
    "n_components float": ("model:\n  n_components: 2.5\n", r"wrong type for 'model.n_components'.*expected int"),
    "n_layers = 0": ("model:\n  n_layers: 0\n", r"'model.n_layers'.*: must be >= 1"),
    "block_size = 0": ("model:\n  block_size: 0\n", r"'model.block_size'.*: must be >= 1"),
    "duplicate key": ("model:\n  n_layers: 2\n  n_layers: 3\n", r"duplicate key 'n_layers'"),
    "r_value with private r": ("privacy:\n  epsilon: 1.0\n  r_source: private\n  r_value: 0.5\n",
                               r"'privacy.r_value'.*remove r_value"),
    "fractional passes": ("privacy:\n  epsilon: 1.0\n  r_value: 0.5\n", r"'privacy.r_value'.*'passes' needs an int"),
    "budget not a pair": ("privacy:\n  epsilon: 1.0\n  budget: 2\n",
                          r"wrong type for 'privacy.budget'.*expected a list"),
    "budget delta = 1": ("privacy:\n  epsilon: 1.0\n  budget: [2, 1]\n", r"'privacy.budget'.*delta >= 0 and < 1"),
    "test_size = 1": ("data:\n  source: sklearn:iris\n  test_size: 1.0\n", r"'data.test_size'.*: must be in \(0, 1\)"),
}


def _yaml(tmp: Path, extra: str) -> Path:
    text = BASE_YAML.format(out=tmp / "run")
    if extra.startswith("data:"):
        text = text.split("data:")[0]
    path = tmp / "p.yaml"
    path.write_text(text + extra)
    return path


@pytest.mark.parametrize("extra,pattern", list(YAML.values()), ids=list(YAML))
def test_yaml_rejects(extra, pattern, tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(_yaml(tmp_path, extra))
    assert re.search(pattern, str(info.value)), str(info.value)
    assert str(tmp_path / "p.yaml") in str(info.value)  # the file is named


# --------------------------------------------------------------------------- the CLI


@pytest.fixture
def no_cluster(monkeypatch):
    """Fail the test if the CLI starts a cluster: validation must come first."""

    def refuse(cfg):
        raise AssertionError("the CLI started a cluster before validating its input")

    monkeypatch.setattr("kahm_dask.cli.session.connect", refuse)


@pytest.fixture
def stores(tmp_path):
    write_dataset(tmp_path / "s.zarr", X, Y, chunk_rows=20)
    write_dataset(tmp_path / "s4.zarr", X[:, :4], Y, chunk_rows=20)
    write_dataset(tmp_path / "s1.zarr", X[:21], Y[:21], chunk_rows=20)
    return tmp_path


def _invoke(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


CLI_TRAIN = {
    "epsilon = 0": (["--epsilon", "0"], r"'--epsilon': 0.0 is not in the range x>0"),
    "epsilon < 0": (["--epsilon", "-1"], r"'--epsilon': -1.0 is not in the range x>0"),
    "delta > 1": (["--epsilon", "1", "--delta", "1.5"], r"'--delta': 1.5 is not in the range 0<=x<1"),
    "delta < 0": (["--epsilon", "1", "--delta=-0.1"], r"'--delta': -0.1 is not in the range 0<=x<1"),
    "bounds upper <= lower": (["--epsilon", "1", "--bounds", "1", "0"], r"upper must exceed lower"),
    "budget epsilon = 0": (["--epsilon", "1", "--budget", "0", "0"],
                           r"'--budget': must be \(ε, δ\) with ε finite and > 0"),
    "d = 0": (["--epsilon", "1", "--d", "0"], r"'--d': 0.0 is not in the range x>0"),
    "n_components = 0": (["--n-components", "0"], r"'--n-components': 0 is not in the range x>=1"),
    "n_layers = 0": (["--n-layers", "0"], r"'--n-layers': 0 is not in the range x>=1"),
    "block_size = 0": (["--block-size", "0"], r"'--block-size': 0 is not in the range x>=1"),
    "seed < 0": (["--seed", "-1"], r"'--seed': -1 is not in the range x>=0"),
    "dp_data unknown": (["--epsilon", "1", "--dp-data", "raw"],
                        r"'--dp-data': 'raw' is not one of 'fabricated', 'noisy'"),
    "fractional passes": (["--epsilon", "1", "--r-source", "passes", "--r-value", "2.5"],
                          r"'--r-value'.*'passes' needs an int >= 1.*Got 2.5"),
    "r_value with private r": (["--epsilon", "1", "--r-source", "private", "--r-value", "0.5"], r"'--r-value'"),
}


@pytest.mark.parametrize("args,pattern", list(CLI_TRAIN.values()), ids=list(CLI_TRAIN))
def test_cli_train_rejects_before_starting_a_cluster(args, pattern, stores, no_cluster):
    result = _invoke("train", stores / "s.zarr", stores / "m.zarr", *args)
    assert result.exit_code in (1, 2), result.output
    assert re.search(pattern, result.output), result.output
    assert "Traceback" not in result.output
    assert not (stores / "m.zarr").exists()


def test_cli_train_rejects_a_single_row_class(stores, no_cluster):
    result = _invoke("train", stores / "s1.zarr", stores / "m.zarr")
    assert result.exit_code == 1
    assert re.search(r"class\(es\) \[1\] have fewer than 2 samples.*Remove these classes or add samples",
                     result.output), result.output


def test_cli_train_warns_when_n_components_exceeds_features(stores, monkeypatch):
    monkeypatch.setattr("kahm_dask.cli.session.connect", lambda cfg: contextlib.nullcontext(None))
    monkeypatch.setattr("kahm_dask.pipeline.estimator.estimator.DaskKAHMClassifier.fit_store",
                        lambda self, *a, **k: {"n_clusters": 2, "n_resumed": 0, "clusters": []})
    result = _invoke("train", stores / "s.zarr", stores / "m.zarr", "--n-components", "20")
    assert result.exit_code == 0, result.output
    assert "--n-components 20 exceeds the 5 features" in result.output


@pytest.mark.parametrize("finished", [0, 2])
def test_cli_killed_worker_is_a_clear_error_with_the_resume_hint(stores, monkeypatch, finished):
    """The resume hint is given only where it is true: when finished clusters are kept."""
    from distributed.scheduler import KilledWorker

    def die(store, model, work, *a, **k):
        for s in range(finished):  # clusters a run finished before the worker died
            (work.path / "model.zarr" / "clusters" / f"c0_s{s}").mkdir(parents=True)
        raise KilledWorker("train_cluster-abc", SimpleNamespace(address="tcp://127.0.0.1:1"), 3)

    monkeypatch.setattr("kahm_dask.cli.session.connect", lambda cfg: contextlib.nullcontext(None))
    monkeypatch.setattr("kahm_dask.pipeline.estimator.estimator.train_pipeline", die)  # the fit behind the CLI
    result = _invoke("train", stores / "s.zarr", stores / "m.zarr", "--n-components", "3")
    assert result.exit_code == 1 and "Traceback" not in result.output and "KilledWorker" in result.output
    assert ("rerun the same command to resume" in result.output) == bool(finished)
    assert (f"The {finished} finished cluster(s) are kept" in result.output) == bool(finished)


CLI_OTHER = {
    "ingest: nan csv": (lambda t: ["ingest", _csv(t, "1,2,3\n4,nan,0\n"), t / "n.zarr"],
                        r"non-finite value at row 1, column 1.*impute"),
    "ingest: missing file": (lambda t: ["ingest", t / "nope.csv", t / "n.zarr"], r"Source file not found"),
    "ingest: existing store": (lambda t: ["ingest", "sklearn:iris", t / "s.zarr"], r"already exists; add --overwrite"),
    "ingest: unknown bundled set": (lambda t: ["ingest", "sklearn:mnist", t / "n.zarr"],
                                    r"Unknown bundled dataset 'sklearn:mnist'"),
    "predict: not a model": (lambda t: ["predict", t / "s.zarr", t / "s.zarr", t / "p.zarr"],
                             r"not a kahm-dask model store"),
    "run: unknown key": (lambda t: ["run", _yaml(t, "evaluate:\n  membrship: true\n")],
                         r"unknown key 'evaluate.membrship'.*did you mean 'membership'"),
    "run: epsilon = 0": (lambda t: ["run", _yaml(t, "privacy:\n  epsilon: 0\n")], r"'privacy.epsilon'.*: must be > 0"),
    "run: delta = 1": (lambda t: ["run", _yaml(t, "privacy:\n  epsilon: 1.0\n  delta: 1.0\n")],
                       r"'privacy.delta'.*: must be >= 0 and < 1"),
    "run: bad budget": (lambda t: ["run", _yaml(t, "privacy:\n  epsilon: 1.0\n"), "--budget", "0", "0"],
                        r"'privacy.budget'.*epsilon > 0"),
}


@pytest.mark.parametrize("make_args,pattern", list(CLI_OTHER.values()), ids=list(CLI_OTHER))
def test_cli_rejects(make_args, pattern, stores, no_cluster):
    result = _invoke(*make_args(stores))
    assert result.exit_code == 1, result.output
    assert re.search(pattern, result.output, re.S), result.output
    assert "Traceback" not in result.output


def test_cli_predict_feature_count_mismatch(stores, monkeypatch):
    monkeypatch.setattr("kahm_dask.cli.session.connect", lambda cfg: contextlib.nullcontext(None))
    train_pipeline(open_store(stores / "s.zarr"), stores / "m.zarr", stores / "w",
                   TrainSettings(TrainParams(3, 2), seed=0), progress=False)
    result = _invoke("predict", stores / "m.zarr", stores / "s4.zarr", stores / "p.zarr")
    assert result.exit_code == 1
    assert re.search(r"s4.zarr has 4 features; the model .* expects 5", result.output), result.output


def open_store(path):
    return open_dataset(path)


# --------------------------------------------------------------------------- pipeline functions


def test_pipeline_predict_feature_count_mismatch(stores):
    train_pipeline(open_store(stores / "s.zarr"), stores / "m.zarr", stores / "w",
                   TrainSettings(TrainParams(3, 2), seed=0), progress=False)
    with pytest.raises(ValueError, match=r"X has shape \(40, 4\); the model expects \(m, 5\)"):
        class_distance_array(stores / "m.zarr", da.from_array(X[:, :4]))
    with pytest.raises(ValueError, match=r"X has shape \(5,\)"):
        class_distance_array(stores / "m.zarr", da.from_array(X[0]))


@pytest.mark.parametrize("epsilon", [None, 1.0])
def test_pipeline_rejects_a_single_row_class_up_front(stores, epsilon):
    with pytest.raises(ValueError, match=r"class\(es\) \[1\] have fewer than 2 samples"):
        train_pipeline(open_store(stores / "s1.zarr"), stores / "m.zarr", stores / "w",
                       TrainSettings(TrainParams(3, 2, epsilon=epsilon), seed=0), progress=False)


def test_pipeline_warns_when_n_components_exceeds_features(stores):
    with pytest.warns(UserWarning, match="exceeds the number of features"):
        train_pipeline(open_store(stores / "s.zarr"), stores / "m.zarr", stores / "w",
                       TrainSettings(TrainParams(20, 2), seed=0), progress=False)


def test_predict_rejects_nan_rows(stores):
    from distributed import Client, LocalCluster

    train_pipeline(open_store(stores / "s.zarr"), stores / "m.zarr", stores / "w",
                   TrainSettings(TrainParams(3, 2), seed=0), progress=False)
    with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster, Client(cluster) as client:
        with pytest.raises(ValueError, match=r"non-finite value at row 3, column 2"):
            predict_to_store(stores / "m.zarr", da.from_array(_with(np.nan), chunks=(20, 5)),
                             stores / "p.zarr", client)


def test_predict_without_a_client(stores):
    train_pipeline(open_store(stores / "s.zarr"), stores / "m.zarr", stores / "w",
                   TrainSettings(TrainParams(3, 2), seed=0), progress=False)
    group = predict_to_store(stores / "m.zarr", da.from_array(X, chunks=(20, 5)), stores / "p.zarr")
    assert group[PREDICTIONS].shape == (40,) and group[DISTANCES].shape == (40, 2)


# --------------------------------------------------------------------------- the helpers


def test_validation_helpers():
    assert check_label_types([1, 2, 3]) == [1, 2, 3]
    assert check_label_types(np.array(["a", "b"])).tolist() == ["a", "b"]
    with pytest.raises(ValueError, match=r"y mixes label types \(number, string\).*astype\(str\)"):
        check_label_types([0, "a"])
    with pytest.raises(ValueError, match=r"bool, number"):
        check_label_types(np.array([True, 2], dtype=object))
    check_class_sizes({"a": 2, "b": 5})
    with pytest.raises(ValueError, match=r"\['b'\] have fewer than 2 samples \('b': 1\)"):
        check_class_sizes({"a": 2, "b": 1})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_n_components(5, 5)
    with pytest.warns(UserWarning, match=r"n_components=6 exceeds the number of features \(5\)"):
        check_n_components(6, 5)
    check_finite_rows(X)
    with pytest.raises(ValueError, match=r"row 13, column 2: nan.*impute"):
        check_finite_rows(_with(np.nan), row_offset=10)
