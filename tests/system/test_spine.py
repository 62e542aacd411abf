"""One parameter spine: every face of a parameter agrees with its entry in ``params.PARAMS``.

The estimators' signatures are written out (scikit-learn's ``get_params`` reads them), so these
tests hold them to the table: the same names in the same order, the same defaults, each one
documented. The faces generated from the table (the pipeline file's fields, ``kahm-dask train``'s
options, the run-level training settings, the manifest's parameters) must cover it with the same
defaults, so that a parameter added to the table and the two signatures reaches every entry point.
(test_params.py checks that every face applies each rule alike.)
"""

from __future__ import annotations

import dataclasses
import inspect
import re

import numpy as np
import pytest

from kahm_dask import DaskKAHMClassifier, KAHMClassifier
from kahm_dask.cli import main
from kahm_dask.cli.options import NOT_OPTIONS, SPECIAL_OPTIONS
from kahm_dask.params import (
    CLASSIFIER_PARAMS,
    NOT_STORED_PARAMS,
    PARAMS,
    PARTITION_PARAMS,
    PREDICTION_PARAMS,
    defaults,
)
from kahm_dask.pipeline.config import ModelConfig, PartitionConfig, PipelineConfig, PrivacyConfig
from kahm_dask.pipeline.config.sections import estimator_params
from kahm_dask.pipeline.training import TrainSettings
from kahm_dask.recipe import TrainParams
from tests._kit import pipeline_dict

ESTIMATORS = {KAHMClassifier: CLASSIFIER_PARAMS, DaskKAHMClassifier: (*CLASSIFIER_PARAMS, *PARTITION_PARAMS)}
#: DaskKAHMClassifier's own parameters: where its stores live, not how the model is made.
DASK_OWN = ("store_dir", "chunk_rows", "storage_options")


def _signature(cls) -> dict[str, inspect.Parameter]:
    return {n: p for n, p in inspect.signature(cls.__init__).parameters.items() if n != "self"}


def _same(a, b) -> bool:
    return type(a) is type(b) and (a == b if not isinstance(a, float) or not np.isnan(a) else np.isnan(b))


@pytest.mark.parametrize("cls", list(ESTIMATORS), ids=lambda c: c.__name__)
def test_signatures_take_the_table_in_order_with_its_defaults(cls):
    sig = _signature(cls)
    own = DASK_OWN if cls is DaskKAHMClassifier else ()
    assert tuple(sig) == (*ESTIMATORS[cls], *own)
    wrong = {n: (p.default, PARAMS[n].default) for n, p in sig.items()
             if n in PARAMS and not _same(p.default, PARAMS[n].default)}
    assert not wrong, wrong
    assert cls().get_params() == {**defaults(*ESTIMATORS[cls]), **{n: None for n in own}}


@pytest.mark.parametrize("cls", list(ESTIMATORS), ids=lambda c: c.__name__)
def test_every_parameter_is_documented(cls):
    doc = inspect.getdoc(cls)
    section = doc[doc.index("Parameters\n----------"):doc.index("Attributes\n----------")]
    heads = re.findall(r"^([a-z_][\w, ]*) : ", section, flags=re.M)  # numpydoc: "a, b : type"
    names = {n.strip() for head in heads for n in head.split(",")}
    missing = set(_signature(cls)) - names
    assert not missing, missing


def test_the_pipeline_file_declares_the_table_with_its_defaults():
    fields = [f for section in (ModelConfig, PrivacyConfig, PartitionConfig) for f in dataclasses.fields(section)
              if "param" in f.metadata]
    declared = {f.metadata["param"]: f.default for f in fields}
    seed = next(f for f in dataclasses.fields(PipelineConfig) if f.name == "seed")
    declared[seed.metadata["param"]] = seed.default
    # A file states its bounds in the data's raw units (data.bounds, with the scaling), and its
    # ledger as a directory (privacy.ledger_dir); threads and test noise are no file's business.
    expected = set(CLASSIFIER_PARAMS + PARTITION_PARAMS) - {"bounds", "ledger", "n_jobs", "insecure_noise_seed"}
    assert set(declared) == expected, set(declared) ^ expected
    wrong = {n: (d, PARAMS[n].default) for n, d in declared.items() if not _same(d, PARAMS[n].default)}
    assert not wrong, wrong


def test_a_default_pipeline_file_gives_the_default_estimator():
    cfg = PipelineConfig.from_mapping(pipeline_dict())
    params = estimator_params(cfg)
    est = DaskKAHMClassifier(**params)
    expected = DaskKAHMClassifier().get_params()
    assert {k: v for k, v in est.get_params().items() if k in params} == {k: expected[k] for k in params}


def test_train_options_cover_the_dask_estimator_with_its_defaults():
    options = {o.name: o for o in main.commands["train"].params}
    wanted = set(ESTIMATORS[DaskKAHMClassifier]) - set(NOT_OPTIONS)
    assert wanted <= set(options), wanted - set(options)
    wanted -= set(SPECIAL_OPTIONS)  # their own defaults: --seed drawn, --ledger-dir the default directory
    wrong = {n: (options[n].default, PARAMS[n].default) for n in wanted
             if options[n].default != PARAMS[n].default and not (options[n].default is None is PARAMS[n].default)}
    assert not wrong, wrong


def test_training_settings_take_every_parameter_back_and_forth():
    """Parameters → TrainSettings → the manifest's parameters loses nothing but what is never
    stored and what acts at prediction only, and every setting with a default has the table's."""
    params = defaults(*ESTIMATORS[DaskKAHMClassifier])
    settings = TrainSettings.from_params({**params, "random_state": 4}, r_value=None)
    stored = set(ESTIMATORS[DaskKAHMClassifier]) - set(NOT_STORED_PARAMS) - set(PREDICTION_PARAMS)
    assert settings.to_params() == {**{n: params[n] for n in stored}, "random_state": 4}
    for cls in (TrainSettings, TrainParams):
        for f in dataclasses.fields(cls):
            name = TrainSettings.RENAMED.get(f.name, f.name)
            if name in PARAMS and f.default is not dataclasses.MISSING:
                assert _same(f.default, PARAMS[name].default), (cls.__name__, f.name)
