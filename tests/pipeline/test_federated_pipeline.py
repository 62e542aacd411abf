"""The federated Dask pipeline (ALGORITHM.md §12) against the in-memory FederatedClassifier.

Given the same site split, seeds and within-class partition labels, every site's model store
equals the in-memory site classifier, so the pipeline's global decision (labels, minimum
distances, winning sites) equals :class:`~kahm_dask.federated.FederatedClassifier`'s. Also:
site pinning by worker resources, and the strict federated YAML schema.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr
from distributed import Client, get_task_stream

from kahm_dask import KAHMClassifier
from kahm_dask.datasets import load_bundled, split_and_scale
from kahm_dask.federated import FederatedClassifier, fit_sites, split_sites
from kahm_dask.pipeline.config import ConfigError
from kahm_dask.pipeline.federated import (
    FederatedPipelineConfig,
    answer_to_store,
    check_site_resources,
    connect_federated,
    load_federated_config,
    run_federated_pipeline,
    site_cluster,
    train_site,
)
from kahm_dask.pipeline.store import write_dataset
from kahm_dask.pipeline.tasks import TrainParams
from kahm_dask.pipeline.train import TrainSettings

PIPELINES = Path(__file__).resolve().parents[2] / "pipelines"


@pytest.fixture(scope="module")
def digits():
    return split_and_scale(*load_bundled("digits"), split_seed=0)


def _halves(y_site: np.ndarray) -> np.ndarray:
    """Within-class branch labels: a class share of ≥ 8 rows is cut into two halves."""
    labels = np.zeros(y_site.size, dtype=np.int64)
    for c in np.unique(y_site):
        rows = np.flatnonzero(y_site == c)
        if rows.size >= 8:
            labels[rows] = 2 * np.arange(rows.size) // rows.size
    return labels


def _config(tmp_path: Path, federation: str, epsilon: float | None) -> FederatedPipelineConfig:
    path = tmp_path / "fed.yaml"
    path.write_text(
        f"""
name: fed-test
seed: 4
output: {tmp_path / 'run'}
data:
  source: sklearn:digits
model:
  n_components: 10
  n_layers: 2
privacy:
  epsilon: {'null' if epsilon is None else epsilon}
  dp_data: noisy
evaluate:
  max_train_rows: 400
report:
  plots: false
federation:
{federation}
cluster:
  n_workers: 2
  processes: false
"""
    )
    return load_federated_config(path)


CASES = [
    ("  sites: 3\n  split: dirichlet\n  alpha: 1.0\n  split_seed: 2", None),
    ("  sites: 4\n  split: label_skew\n  classes_per_site: 3\n  pin_sites: true", 2.0),
]


@pytest.mark.parametrize("federation, epsilon", CASES, ids=["dirichlet", "label_skew-dp-pinned"])
def test_federated_pipeline_equals_in_memory(tmp_path, digits, federation, epsilon):
    cfg = _config(tmp_path, federation, epsilon)
    fed_cfg = cfg.federation
    sites = split_sites(digits.y_train, fed_cfg.sites, fed_cfg.split, alpha=fed_cfg.alpha,
                        classes_per_site=fed_cfg.classes_per_site, random_state=fed_cfg.split_seed)
    partitions = [_halves(digits.y_train[rows]) for rows in sites]
    assert max(p.max() for p in partitions) == 1  # several branches per class: min is exercised

    with connect_federated(cfg) as client:
        report = run_federated_pipeline(cfg, client, progress=False, site_partitions=partitions)

    estimator = KAHMClassifier(10, 2, random_state=cfg.seed, epsilon=epsilon, dp_data="noisy")
    fed = FederatedClassifier(fit_sites(estimator, digits.X_train, digits.y_train, sites,
                                        partitions=partitions))
    want = fed.decide(digits.X_test)
    group = zarr.open_group(str(cfg.output / "predictions.zarr"), mode="r")
    classes = np.asarray(group.attrs["classes"])
    np.testing.assert_array_equal(classes[group["label"][:]], want.label)
    np.testing.assert_allclose(group["min_distance"][:], want.min_distance, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(group["site"][:], want.site)

    assert report["accuracy"] == pytest.approx(fed.score(digits.X_test, digits.y_test))
    assert report["site_sizes"] == [int(r.size) for r in sites]
    assert report["n_train_used"] == 400 and 0.0 <= report["attack_auc"] <= 1.0
    assert json.loads((cfg.output / "report.json").read_text())["n_sites"] == fed_cfg.sites
    for q in range(fed_cfg.sites):  # a site's answers are two (m,) arrays, nothing else
        answers = zarr.open_group(str(cfg.output / f"sites/site{q}/answers/test.zarr"), mode="r")
        assert sorted(answers.array_keys()) == ["label", "min_distance"]


def test_pinned_site_tasks_run_on_the_site_worker(tmp_path, digits):
    sites = split_sites(digits.y_train, 3, "iid", random_state=0)
    settings = TrainSettings(TrainParams(5, 1, epsilon=1.0, dp_data="noisy"), seed=1)
    with site_cluster(2, 3, processes=False) as cluster, Client(cluster) as client:
        resources = {a: w["resources"] for a, w in client.scheduler_info()["workers"].items()}
        holder = {}
        for q, rows in enumerate(sites):
            store = write_dataset(tmp_path / f"s{q}" / "train.zarr", digits.X_train[rows],
                                  digits.y_train[rows])
            model = tmp_path / f"s{q}" / "model.zarr"
            with get_task_stream(client) as ts:
                train_site(q, store, tmp_path / f"s{q}", settings, client, pin=True)
                answer_to_store(q, model, store.X(), store.classes, tmp_path / f"a{q}.zarr",
                                client, pin=True)
            workers = {r["worker"] for r in ts.data}
            assert ts.data and len(workers) == 1  # all of site q's tasks on one worker ...
            holder[q] = workers.pop()
            assert resources[holder[q]] == {f"site{s}": 1 for s in range(q % 2, 3, 2)}  # ... its own
        assert holder[0] != holder[1] and holder[0] == holder[2]
        with pytest.raises(ValueError, match="site3"):
            check_site_resources(client, 4)


def test_federated_yaml_files_and_strict_schema(tmp_path):
    iid = load_federated_config(PIPELINES / "federated_iid.yaml")
    skew = load_federated_config(PIPELINES / "federated_label_skew.yaml")
    for cfg in (iid, skew):
        assert cfg.data.source == "sklearn:digits" and cfg.privacy.epsilon == 2.0
        assert cfg.federation.sites == 5
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
