"""The federated Dask pipeline (docs/federated.md) against the in-memory FederatedClassifier.

Given the same site split, seeds, test-only noise seeds and within-class partition labels,
every site's model store equals the in-memory site classifier, so the pipeline's global
decision (labels, minimum distances, winning sites) and each site's membership report equal
:class:`~kahm_dask.federated.FederatedClassifier`'s. Also: the site boundary (no site's model
is ever evaluated on another site's training rows; pinned tasks run on the site's worker),
no noise shared between sites, the public/owner folders of every site, and the strict
federated YAML schema.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
import zarr
from distributed import Client, get_task_stream, get_worker

import kahm_dask.pipeline.predict as predict_module
import kahm_dask.pipeline.stores.sources as store_module
from kahm_dask import KAHMClassifier
from kahm_dask.federated import FederatedClassifier, fit_sites, split_sites
from kahm_dask.pipeline.cluster.sites import check_site_resources, connect_federated, site_cluster
from kahm_dask.pipeline.config import ConfigError
from kahm_dask.pipeline.config.sections import FederatedPipelineConfig, load_federated_config
from kahm_dask.pipeline.runs.federated import run_federated_pipeline
from kahm_dask.pipeline.runs.sites import answer_to_store, site_membership, train_site
from kahm_dask.pipeline.stores.dataset import open_dataset, write_dataset
from kahm_dask.pipeline.training import NOISY, TrainSettings
from kahm_dask.privacy.randomness import PrivacyLeakWarning
from kahm_dask.recipe import TrainParams
from tests._kit import PIPELINES, ledger_of, pipeline_file

NOISE_SEED = 13  # test-only: both paths draw site q's noise from site_noise_seed(13, q)

# ------------------------------------------------------------------ what each site's model sees
_SEEN: list[tuple[int, str, set]] = []  # (site, worker, rows as bytes) per distance block
_WRITTEN: list[tuple[str, set]] = []  # (worker, rows as bytes) per block written to a data store
_SEEN_LOCK = threading.Lock()
_ORIGINAL_CLUSTER_DISTANCES = predict_module._cluster_distances
_ORIGINAL_STORE_BLOCK = store_module._store_block


def _where() -> str:
    try:
        return get_worker().address
    except ValueError:
        return "client"


def _recording_cluster_distances(x: np.ndarray, path, *args) -> np.ndarray:
    """``_cluster_distances`` that records which site's model (``path``: its model store's location)
    is asked about which rows, where."""
    site = int(re.search(r"sites/site(\d+)/", str(path)).group(1))
    rows = {row.tobytes() for row in np.asarray(x, dtype=np.float64)}
    with _SEEN_LOCK:
        _SEEN.append((site, _where(), rows))
    return _ORIGINAL_CLUSTER_DISTANCES(x, path, *args)


def _recording_store_block(block: np.ndarray, x, start: int):
    """``_store_block`` (writes a block of a dataset store) that records which rows, where."""
    rows = {row.tobytes() for row in np.asarray(block, dtype=np.float64)}
    with _SEEN_LOCK:
        _WRITTEN.append((_where(), rows))
    return _ORIGINAL_STORE_BLOCK(block, x, start)


def _row_set(X) -> set:
    return {row.tobytes() for row in np.asarray(X, dtype=np.float64)}


def _halves(y_site: np.ndarray) -> np.ndarray:
    """Within-class branch labels: a class share of ≥ 8 rows is cut into two halves."""
    labels = np.zeros(y_site.size, dtype=np.int64)
    for c in np.unique(y_site):
        rows = np.flatnonzero(y_site == c)
        if rows.size >= 8:
            labels[rows] = 2 * np.arange(rows.size) // rows.size
    return labels


def _config(tmp_path: Path, federation: dict, epsilon: float | None) -> FederatedPipelineConfig:
    path = pipeline_file(tmp_path / "fed.yaml", name="fed-test", seed=4, federation=federation, **{
        "data.source": "sklearn:digits", "data.bounds": [0, 16], "model.n_components": 10, "model.n_layers": 2,
        "privacy.epsilon": epsilon, "privacy.dp_data": "noisy", "evaluate.max_train_rows": 150,
        "report.plots": False, "cluster.n_workers": 2, "cluster.processes": False})
    return load_federated_config(path)


CASES = [  # the non-private Dirichlet case (~13 s) runs in the slow job; the DP pinned case in the default suite
    pytest.param({"sites": 3, "split": "dirichlet", "alpha": 1.0, "split_seed": 2}, None, id="dirichlet",
                 marks=pytest.mark.slow),
    pytest.param({"sites": 4, "split": "label_skew", "classes_per_site": 3, "pin_sites": True}, 2.0,
                 id="label_skew-dp-pinned"),
]


@pytest.mark.parametrize("federation, epsilon", CASES)
def test_federated_pipeline_equals_in_memory_and_keeps_rows_at_their_site(
    tmp_path, digits, monkeypatch, federation, epsilon
):
    cfg = _config(tmp_path, federation, epsilon)
    fed_cfg = cfg.federation
    sites = split_sites(digits.y_train, fed_cfg.sites, fed_cfg.split, alpha=fed_cfg.alpha,
                        classes_per_site=fed_cfg.classes_per_site, random_state=fed_cfg.split_seed)
    partitions = [_halves(digits.y_train[rows]) for rows in sites]
    assert max(p.max() for p in partitions) == 1  # several branches per class: min is exercised
    private = epsilon is not None
    noise_seed = NOISE_SEED if private else None

    monkeypatch.setattr(predict_module, "_cluster_distances", _recording_cluster_distances)
    monkeypatch.setattr(store_module, "_store_block", _recording_store_block)
    _SEEN.clear(), _WRITTEN.clear()
    with pytest.warns(PrivacyLeakWarning) if private else _no_warning():
        with connect_federated(cfg) as client:
            holders = {a: set(w["resources"]) for a, w in client.scheduler_info()["workers"].items()}
            report = run_federated_pipeline(cfg, client, progress=False, site_partitions=partitions,
                                            insecure_noise_seed=noise_seed)
    seen, written = list(_SEEN), list(_WRITTEN)
    monkeypatch.undo()

    # ---- the site boundary: site q's model is asked about its own training rows and the
    # shared test rows (the coordinator's queries) only, on site q's own worker when pinned
    test_rows = _row_set(digits.X_test)
    for q, rows in enumerate(sites):
        own = _row_set(digits.X_train[rows])
        foreign = _row_set(np.delete(digits.X_train, rows, axis=0)) - own - test_rows
        asked = set().union(*(r for site, _, r in seen if site == q))
        assert foreign and not asked & foreign, f"site {q}'s model saw another site's rows"
        assert asked <= own | test_rows and asked & (own - test_rows)
        if fed_cfg.pin_sites:
            workers = {w for site, w, _ in seen if site == q}
            assert workers and all(f"site{q}" in holders[w] for w in workers)
    if fed_cfg.pin_sites:  # no worker ever holds a training row of a site it does not serve
        assert written  # the site stores were written block by block ...
        for worker, rows in [(w, r) for _, w, r in seen] + written:
            if worker == "client":  # ... by the simulation harness, outside the federation
                continue
            served = [q for q in range(fed_cfg.sites) if f"site{q}" in holders[worker]]
            allowed = test_rows.union(*(_row_set(digits.X_train[sites[q]]) for q in served))
            assert rows <= allowed, f"worker {worker} held rows of a site it does not serve"

    # ---- equal to the in-memory federation
    estimator = KAHMClassifier(10, 2, random_state=cfg.seed, epsilon=epsilon, bounds=(0, 1),
                               dp_data="noisy", insecure_noise_seed=noise_seed)
    with pytest.warns(PrivacyLeakWarning) if private else _no_warning():
        fed = FederatedClassifier(fit_sites(estimator, digits.X_train, digits.y_train, sites,
                                            partitions=partitions))
    want = fed.decide(digits.X_test)
    out = cfg.output
    group = zarr.open_group(str(out / "owner" / "predictions.zarr"), mode="r")
    classes = np.asarray(group.attrs["classes"])
    np.testing.assert_array_equal(classes[group["label"][:]], want.label)
    np.testing.assert_allclose(group["min_distance"][:], want.min_distance, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(group["site"][:], want.site)
    assert report["accuracy"] == pytest.approx(fed.score(digits.X_test, digits.y_test))
    assert report["site_sizes"] == [int(r.size) for r in sites]
    assert report["evaluate_seconds"] > 0  # timed like a central run's evaluation

    # ---- membership: per-site reports equal the in-memory site-local evaluation
    mem = fed.membership_evaluation([digits.X_train[rows] for rows in sites], digits.X_test,
                                    max_train_rows=150, random_state=cfg.data.split_seed)
    assert report["n_train_used"] == sum(min(150, r.size) for r in sites)
    assert len(report["site_membership"]) == fed_cfg.sites
    for q, (inference, attack) in enumerate(mem.sites):
        got = report["site_membership"][q]
        assert got["site"] == q and got["n_train_used"] == inference.n_train_used
        assert got["attack_auc"] == pytest.approx(attack.auc, abs=1e-12)
        assert got["mis"] == pytest.approx(inference.mis, rel=1e-6, abs=1e-9)
        on_site = json.loads((out / f"sites/site{q}/owner/membership.json").read_text())
        assert on_site["attack_auc"] == got["attack_auc"]
    assert report["attack_auc"] == pytest.approx(mem.attack.auc, abs=1e-12)
    assert report["worst_site"] == mem.worst_site

    # ---- folders: every site split at the release boundary; the report stays with the owner
    assert json.loads((out / "owner" / "report.json").read_text())["n_sites"] == fed_cfg.sites
    assert not (out / "report.json").exists() and not (out / "predictions.zarr").exists()
    for q in range(fed_cfg.sites):
        site = out / f"sites/site{q}"
        assert (site / "owner/data/train.zarr").is_dir() and (site / "owner/work").is_dir()
        if private:
            assert (site / "public/model.zarr").is_dir()
            assert "Privacy statement" in (site / "public/PRIVACY.md").read_text()
            assert sorted(p.name for p in (site / "public").iterdir()) == ["PRIVACY.md", "model.zarr"]
            store = open_dataset(site / "owner/data/train.zarr")
            assert ledger_of(store).spent()[0] == pytest.approx(epsilon, rel=1e-3)
        else:
            assert (site / "owner/model.zarr").is_dir() and not (site / "public").exists()
        answers = zarr.open_group(str(site / "answers/test.zarr"), mode="r")
        assert sorted(answers.array_keys()) == ["label", "min_distance"]  # ρ_q and ĉ_q only
        assert not (site / "answers/train.zarr").exists()  # no training rows are ever queried
    if private:
        releases = [p["release_id"] for p in report["site_privacy"]]
        assert len(set(releases)) == fed_cfg.sites  # one release per site, none shared


class _no_warning:
    """A context manager that does nothing (the non-private case expects no warning)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_sites_with_identical_rows_release_different_noise(tmp_path, digits):
    """No noise reuse across sites: two sites holding the same rows, trained with the same
    settings and seed, release different noisy rows (the secure source, not the seed)."""
    settings = TrainSettings(TrainParams(5, 1, epsilon=2.0, dp_data="noisy"), seed=1, bounds=(0, 1))
    noisy = []
    for q in range(2):
        store = write_dataset(tmp_path / f"s{q}" / "train.zarr", digits.X_train[:300], digits.y_train[:300])
        train_site(q, store, tmp_path / f"s{q}", settings, None)
        noisy.append(da.from_zarr(str(tmp_path / f"s{q}" / "work" / NOISY)).compute())
    assert noisy[0].shape == (300, 64)
    assert np.mean(noisy[0] == noisy[1]) < 0.05


def test_a_failed_rewrite_of_a_sites_answers_keeps_the_previous_ones(tmp_path, digits, monkeypatch):
    """Answer stores (and predictions.zarr, written alike) replace the old store atomically:
    a failed write leaves it whole, and no temporary sibling stays behind."""
    store = write_dataset(tmp_path / "s0" / "train.zarr", digits.X_train[:300], digits.y_train[:300])
    train_site(0, store, tmp_path / "s0", TrainSettings(TrainParams(5, 1), seed=1), None)
    queries = write_dataset(tmp_path / "test.zarr", digits.X_test, digits.y_test).X()
    model, out = tmp_path / "s0" / "model.zarr", tmp_path / "answers" / "test.zarr"
    answer_to_store(0, model, queries, store.classes, out, None)
    before = zarr.open_group(str(out), mode="r")["min_distance"][:]

    def lost_worker(*args, **kwargs):
        raise RuntimeError("lost worker")

    monkeypatch.setattr(predict_module, "_cluster_distances", lost_worker)
    with pytest.raises(RuntimeError, match="lost worker"):
        answer_to_store(0, model, queries, store.classes, out, None)
    np.testing.assert_array_equal(zarr.open_group(str(out), mode="r")["min_distance"][:], before)
    assert [p.name for p in out.parent.iterdir()] == ["test.zarr"]


def test_pinned_site_tasks_run_on_the_site_worker(tmp_path, digits):
    """Training, answers and the membership evaluation of site q all run on site q's worker."""
    sites = split_sites(digits.y_train, 3, "iid", random_state=0)
    settings = TrainSettings(TrainParams(5, 1, epsilon=1.0, dp_data="noisy"), seed=1, bounds=(0, 1))
    queries = write_dataset(tmp_path / "test.zarr", digits.X_test, digits.y_test)
    with site_cluster(2, 3, processes=False) as cluster, Client(cluster) as client:
        resources = {a: w["resources"] for a, w in client.scheduler_info()["workers"].items()}
        holder = {}
        for q, rows in enumerate(sites):
            store = write_dataset(tmp_path / f"s{q}" / "train.zarr", digits.X_train[rows],
                                  digits.y_train[rows])
            model = tmp_path / f"s{q}" / "model.zarr"
            with get_task_stream(client) as ts:
                train_site(q, store, tmp_path / f"s{q}", settings, client, pin=True)
                answers = answer_to_store(q, model, queries.X(), store.classes,
                                          tmp_path / f"a{q}.zarr", client, pin=True)
                summary = site_membership(q, store, model, answers, tmp_path / f"m{q}.json",
                                          client, max_train_rows=100, pin=True)
            workers = {r["worker"] for r in ts.data}
            assert ts.data and len(workers) == 1  # all of site q's tasks on one worker ...
            holder[q] = workers.pop()
            assert resources[holder[q]] == {f"site{s}": 1 for s in range(q % 2, 3, 2)}  # ... its own
            assert summary["n_train_used"] == 100 and 0 <= summary["attack_auc"] <= 1
            assert json.loads((tmp_path / f"m{q}.json").read_text())["mis"] == summary["mis"]
        assert holder[0] != holder[1] and holder[0] == holder[2]
        with pytest.raises(ValueError, match="site3"):
            check_site_resources(client, 4)


def test_federated_yaml_files_and_strict_schema(tmp_path):
    iid = load_federated_config(PIPELINES / "federated_iid.yaml")
    skew = load_federated_config(PIPELINES / "federated_label_skew.yaml")
    for cfg in (iid, skew):
        assert cfg.data.source == "sklearn:digits" and cfg.privacy.epsilon == 2.0
        assert cfg.data.bounds == [0, 16] and cfg.data.scale == "minmax"  # public bounds
        assert cfg.privacy.delta == 0 and cfg.privacy.d is None  # pure ε-DP, d = the width
        assert cfg.privacy.r_source == "passes" and cfg.privacy.cluster_on == "noisy"
        assert cfg.seed is None and cfg.federation.sites == 5 and cfg.federation.pin_sites
    assert iid.federation.split == "iid" and skew.federation.classes_per_site == 2
    moved = skew.with_overrides(output=str(tmp_path / "x"), **{"federation.sites": 10})
    assert isinstance(moved, FederatedPipelineConfig) and moved.federation.sites == 10

    text = (PIPELINES / "federated_label_skew.yaml").read_text()
    for old, new, message in [
        ("classes_per_site: 2", "classes_per_sites: 2", "unknown key 'federation.classes_per_sites'"),
        ("  classes_per_site: 2", "", "federation.classes_per_site"),
        ("split: label_skew", "split: dirichlet", "federation.classes_per_site"),
        ("sites: 5", "sites: 0", "federation.sites"),
        ("split: label_skew", "split: shards", "federation.split"),
    ]:
        bad = tmp_path / "bad.yaml"
        bad.write_text(text.replace(old, new))
        with pytest.raises(ConfigError, match=message):
            load_federated_config(bad)
    bad.write_text(text.split("federation:")[0] + "cluster:\n  n_workers: 1\n")
    with pytest.raises(ConfigError, match="missing required key 'federation'"):
        load_federated_config(bad)


def test_site_answers_route_like_the_central_prediction(tmp_path, digits):
    """A site's answers with ``n_probe`` are the minimum over the routed class distances of
    :func:`class_distance_array`; ``n_probe`` ≥ the clusters of every class is the exhaustive
    answer, bit for bit."""
    from kahm_dask.pipeline.predict import class_distance_array

    store = write_dataset(tmp_path / "s0" / "train.zarr", digits.X_train, digits.y_train)
    train_site(0, store, tmp_path / "s0", TrainSettings(TrainParams(5, 1), seed=1, block_size=40), None)
    queries = write_dataset(tmp_path / "test.zarr", digits.X_test, digits.y_test).X()
    model = tmp_path / "s0" / "model.zarr"

    def answers(name, n_probe):
        out = answer_to_store(0, model, queries, store.classes, tmp_path / name, None, n_probe=n_probe)
        return zarr.open_group(str(out), mode="r")["min_distance"][:]

    routed = answers("routed.zarr", 1)
    np.testing.assert_array_equal(routed, class_distance_array(model, queries, n_probe=1).min(axis=1).compute())
    exhaustive = answers("all.zarr", None)
    assert answers("wide.zarr", 1000).tobytes() == exhaustive.tobytes()
    assert np.all(routed >= exhaustive * (1 - 1e-12)) and not np.array_equal(routed, exhaustive)
