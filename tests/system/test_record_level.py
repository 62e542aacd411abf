"""A record-level target on the pipeline's entry points: ``kahm-dask train --record-epsilon``,
``DaskKAHMClassifier(record_epsilon=...)``, ``privacy.record_epsilon`` in a pipeline file; each
solves the ε per entry from the store's features and states both in the privacy statement."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from click.testing import CliRunner

from kahm_dask import DaskKAHMClassifier
from kahm_dask.cli import main
from kahm_dask.datasets import make_class_blobs
from kahm_dask.pipeline.config import PipelineConfig
from kahm_dask.pipeline.config.sections import estimator_params
from kahm_dask.pipeline.stores.dataset import write_dataset
from kahm_dask.privacy.accounting import entry_epsilon_for_record
from tests._kit import ledger_of, pipeline_dict

#: The ε per entry that meets a record ε of 4 over the 5 features of the store (δ = 1e-5).
ENTRY_EPSILON = entry_epsilon_for_record(4.0, 5)


@pytest.fixture
def store(tmp_path):
    X, y = make_class_blobs(200, 5, 2, random_state=4)
    return write_dataset(tmp_path / "data.zarr", np.clip(X, 0, 1), y, chunk_rows=50)


def _cli_train(args: list[str], monkeypatch):
    monkeypatch.setattr("kahm_dask.cli.session.connect", lambda cfg: contextlib.nullcontext(None))
    return CliRunner().invoke(main, ["train", *args, "--n-components", "3", "--bounds", "0", "1"])


def test_train_with_a_record_epsilon(tmp_path, store, monkeypatch):
    model = tmp_path / "m.zarr"
    result = _cli_train([str(store.path), str(model), "--record-epsilon", "4"], monkeypatch)
    assert result.exit_code == 0, result.output
    (entry,) = ledger_of(store).entries
    assert entry["epsilon"] == pytest.approx(ENTRY_EPSILON) and ENTRY_EPSILON >= 4.0 / 5  # at least the basic share
    statement = (tmp_path / "m.zarr.PRIVACY.md").read_text()
    assert f"ε = {ENTRY_EPSILON:g} per entry" in statement
    assert "| ε per record (5 features, δ = 1e-05) | 4 |" in statement


def test_train_with_both_epsilons_is_refused_before_the_release(tmp_path, store, monkeypatch):
    result = _cli_train([str(store.path), str(tmp_path / "m.zarr"), "--epsilon", "1", "--record-epsilon", "4"],
                        monkeypatch)
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "set epsilon (per entry) or record_epsilon (per record), not both" in result.output
    assert ledger_of(store).entries == []


def test_a_target_too_small_is_refused_before_the_release(tmp_path, store, monkeypatch):
    result = _cli_train([str(store.path), str(tmp_path / "m.zarr"), "--record-epsilon", "0.001"], monkeypatch)
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "the noise (scale d/epsilon, over 1000 times d) swamps the bounds" in result.output
    assert ledger_of(store).entries == [] and not (tmp_path / "m.zarr").exists()


def test_the_dask_estimator_takes_a_record_epsilon(tmp_path, store):
    clf = DaskKAHMClassifier(n_components=3, record_epsilon=4.0, bounds=(0.0, 1.0), random_state=0,
                             store_dir=tmp_path / "est")
    clf.fit_store(store, tmp_path / "m.zarr", tmp_path / "w")
    assert clf.epsilon_ == pytest.approx(ENTRY_EPSILON)
    assert clf.privacy_statement_.epsilon_per_record.pld == pytest.approx(4.0, rel=1e-5)
    assert ledger_of(store).spent()[0] == pytest.approx(ENTRY_EPSILON)
    assert clf.to_local().epsilon_ == clf.epsilon_


def test_a_pipeline_file_takes_a_record_epsilon():
    cfg = PipelineConfig.from_mapping(pipeline_dict(**{"privacy.record_epsilon": 4.0, "privacy.record_delta": 1e-6}))
    assert cfg.privacy.private
    params = estimator_params(cfg)
    assert (params["epsilon"], params["record_epsilon"], params["record_delta"]) == (None, 4.0, 1e-6)
    settings = DaskKAHMClassifier(**params).train_settings()
    assert settings.private and settings.params.epsilon is None
    solved = settings.for_features(5)
    assert solved.params.epsilon == pytest.approx(entry_epsilon_for_record(4.0, 5, 1e-6))
    assert solved.to_params()["epsilon"] is None  # the manifest records the parameters as given
    with pytest.raises(ValueError, match="privacy.record_epsilon.*set epsilon .per entry. or record_epsilon"):
        PipelineConfig.from_mapping(pipeline_dict(**{"privacy.record_epsilon": 4.0, "privacy.epsilon": 1.0}))
