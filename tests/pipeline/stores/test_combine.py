"""``kahm-dask combine``: the global model store of a federation (docs/federated.md#across-clusters).

The sites are DP models of the digits (scaled by their public bounds 0–16), trained through the
CLI on the default scheduler (no cluster: fast): site ``a`` holds classes 0–6 of the even rows,
site ``b`` classes 3–9 of the odd rows (they share 3–6, so the global store renumbers them).
Checked: the global store predicts (``kahm-dask predict``) as the simulated federated rule over
the sites' own class distances (:func:`tests._kit.federated_rule`), its class distances being
the minimum over the sites holding each class, bit for bit; its PRIVACY.md lists each site; and
each refusal is one line on the command line that writes nothing.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

from kahm_dask.cli import main
from kahm_dask.pipeline.predict import DISTANCES, PREDICTIONS
from kahm_dask.pipeline.stores.dataset import write_dataset
from kahm_dask.pipeline.stores.manifest import read_manifest
from kahm_dask.privacy.ledger import LEDGER_DIR_ENV
from tests._kit import digits_split, federated_rule, leftovers

#: Small, fast site models: each class of a site is one cluster of ≈ 60 rows.
TRAIN = ["--n-components", "5", "--n-layers", "2", "--seed", "1"]
#: How the digits were scaled (their public raw bounds), recorded in every site's store.
SCALING = {"kind": "minmax", "raw_lower": 0.0, "raw_upper": 16.0}


def _invoke(*args) -> object:
    return CliRunner().invoke(main, [str(a) for a in args])


def _site_store(path: Path, X: np.ndarray, y: np.ndarray) -> Path:
    write_dataset(path, X, y, feature_range=(0.0, 1.0), scaling=SCALING)
    return path


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    """``(folder, models, test)``: the site models by name, trained through the CLI (each DP
    one under ε = 2, in the fixture's own ledger directory), and the digits' test split."""
    tmp = tmp_path_factory.mktemp("sites")
    digits = digits_split()
    X, y = digits.X_train, digits.y_train
    even, odd = np.arange(len(y)) % 2 == 0, np.arange(len(y)) % 2 == 1
    a, b, high = even & (y <= 6), odd & (y >= 3), odd & (y >= 7)
    stores = {
        "a": _site_store(tmp / "a.zarr", X[a], y[a]),
        "b": _site_store(tmp / "b.zarr", X[b], y[b]),
        "high": _site_store(tmp / "high.zarr", X[high], y[high]),  # classes 7–9 only: none of a's
        "features": _site_store(tmp / "features.zarr", X[b][:, :63], y[b]),
        "labels": _site_store(tmp / "labels.zarr", X[b], np.array([f"digit {c}" for c in y[b]])),
    }
    runs = {name: (name, ["--epsilon", "2"]) for name in stores}
    runs |= {"plain": ("b", []), "bounds": ("b", ["--epsilon", "2", "--bounds", "0", "2"]),
             "d": ("b", ["--epsilon", "2", "--d", "0.5"])}
    models = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(LEDGER_DIR_ENV, str(tmp / "ledgers"))
        mp.setattr("kahm_dask.cli.session.connect", lambda cfg: contextlib.nullcontext(None))
        for name, (store, options) in runs.items():
            models[name] = tmp / "models" / f"{name}.zarr"
            result = _invoke("train", stores[store], models[name], *options, *TRAIN)
            assert result.exit_code == 0, result.output
    return tmp, models, digits


def test_the_global_store_predicts_as_the_federated_rule(sites, tmp_path, monkeypatch):
    _, models, digits = sites
    # row chunks of federated_rule's 200 rows: the same blocks, so the same bits (a GEMM's rounding
    # depends on the shape of the blocks it is given)
    test_store = write_dataset(tmp_path / "test.zarr", digits.X_test, digits.y_test, chunk_rows=200)
    glob = tmp_path / "global.zarr"
    result = _invoke("combine", models["a"], models["b"], glob)
    assert result.exit_code == 0, result.output
    manifest = read_manifest(glob)
    assert manifest["classes"] == list(range(10)) and len(manifest["clusters"]) == 14  # 7 + 7 class models
    assert [s["classes"] for s in manifest["federation"]["sites"]] == [list(range(7)), list(range(3, 10))]

    monkeypatch.setattr("kahm_dask.cli.session.connect", lambda cfg: contextlib.nullcontext(None))
    result = _invoke("predict", glob, test_store.path, tmp_path / "pred.zarr")
    assert result.exit_code == 0, result.output
    out = zarr.open_group(tmp_path / "pred.zarr", mode="r")
    D, predicted = out[DISTANCES][:], np.asarray(out.attrs["classes"])[out[PREDICTIONS][:]]

    rule = federated_rule([models["a"], models["b"]], digits.X_test)
    per_site = [federated_rule([m, m], digits.X_test) for m in (models["a"], models["b"])]
    # class c's distance is the minimum over the sites holding it: the same cluster models, the same blocks
    np.testing.assert_array_equal(D.min(axis=1), rule.min_distance)
    np.testing.assert_array_equal(D.min(axis=1), np.minimum(*(s.min_distance for s in per_site)))
    two = np.sort(D, axis=1)[:, :2]
    tied = two[:, 0] == two[:, 1]  # an exact tie of two classes: either label is the rule's
    assert not tied.all()
    np.testing.assert_array_equal(predicted[~tied], rule.label[~tied])
    assert (predicted == digits.y_test).mean() > 0.5  # a model, not noise (ten classes)


def test_the_privacy_statement_lists_each_site(sites, tmp_path):
    _, models, _ = sites
    glob = tmp_path / "global.zarr"
    assert _invoke("combine", models["a"], models["b"], glob).exit_code == 0
    text = Path(f"{glob}.PRIVACY.md").read_text()
    assert "No row left a site" in text
    for q, name in enumerate(("a", "b")):
        release = read_manifest(models[name])["privacy"]["release_id"]
        assert f"## Site {q}: {models[name]}" in text and f"Release {release}" in text
    assert text.count("### Its guarantee") == 2


def test_sites_without_a_shared_class_combine_when_said_so(sites, tmp_path):
    _, models, _ = sites
    result = _invoke("combine", models["a"], models["high"], tmp_path / "g.zarr", "--disjoint-classes")
    assert result.exit_code == 0, result.output
    assert read_manifest(tmp_path / "g.zarr")["classes"] == list(range(10))


#: Each refusal: the second site (against site a) and the message's pattern.
REFUSALS = {
    "other features": ("features", r"features\.zarr has 63 features, .*a\.zarr has 64"),
    "other public bounds": ("bounds", r"other public bounds or scaling of the features \(.*\[0(\.0)?, 2(\.0)?\]"),
    "other-typed labels": ("labels", r"their labels are of other types"),
    "DP with non-DP": ("plain", r"a\.zarr is differentially private and .*plain\.zarr is not"),
    "other d": ("d", r"another unit of privacy \(d = 0\.5 at .*d\.zarr, 1(\.0)? at"),
    "no shared class": ("high", r"they share no class .*--disjoint-classes"),
    "the same store twice": ("a", r"the same model store is named twice"),
}


@pytest.mark.parametrize("other,pattern", list(REFUSALS.values()), ids=list(REFUSALS))
def test_a_refusal_is_one_line_and_writes_nothing(sites, tmp_path, other, pattern):
    _, models, _ = sites
    glob = tmp_path / "g.zarr"
    result = _invoke("combine", models["a"], models[other], glob)
    assert result.exit_code == 1, result.output
    assert re.search(pattern, result.output), result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == [] and not leftovers(tmp_path)


def test_an_existing_global_store_is_refused_and_kept(sites, tmp_path):
    _, models, _ = sites
    glob = tmp_path / "g.zarr"
    assert _invoke("combine", models["a"], models["b"], glob).exit_code == 0
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    result = _invoke("combine", models["a"], models["high"], glob, "--disjoint-classes")
    assert result.exit_code == 1 and re.search(r"g\.zarr exists; choose another path", result.output), result.output
    assert len(result.output.strip().splitlines()) == 1
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
