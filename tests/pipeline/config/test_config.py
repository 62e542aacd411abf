"""The pipeline YAML schema: defaults, round trip, strict validation, paths, overrides."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from kahm_dask.pipeline.config import (
    ConfigError,
    ModelConfig,
    PipelineConfig,
    PrivacyConfig,
    SyntheticConfig,
    load_config,
)
from tests._kit import PIPELINES, pipeline_dict, pipeline_file

#: The minimal file of these tests: a relative output (resolved against the working directory).
BASE = {"name": "digits", "output": "runs/digits", "data.source": "sklearn:digits"}
MINIMAL = pipeline_dict(**BASE)

FULL_YAML = """\
name: full
seed: 7
output: runs/full
data:
  source: synthetic:blobs
  test_source: null
  test_size: 0.25
  split_seed: 3
  scale: tanh255
  chunk_rows: 5000
  synthetic: {n_samples: 2000, n_features: 8, n_classes: 3, dtype: float32}
model:
  n_components: 10
  n_layers: 3
  block_size: 500
  s_rule: ceil
  min_cluster_size: 40
privacy:
  epsilon: 2.5
  delta: 1e-6
  d: 0.5
  dp_data: noisy
  r_source: threshold
  r_value: 12
  cluster_on: noisy
  max_passes: 50
partition:
  oversampling_factor: 40
  init_max_iter: 3
  max_iter: 60
evaluate:
  membership: no
  max_train_rows: 1000
report:
  plots: false
cluster:
  scheduler: tcp://127.0.0.1:8786
  config: null
  n_workers: 4
  threads_per_worker: 2
  memory_limit: 2GiB
  processes: false
"""

DEFAULTS = {
    "seed": None,
    "data.test_source": None,
    "data.test_size": 0.3,
    "data.split_seed": 0,
    "data.scale": "minmax",
    "data.bounds": None,
    "data.chunk_rows": None,
    "data.synthetic": None,
    "model.n_components": 20,
    "model.n_layers": 1,
    "model.block_size": 1000,
    "model.s_rule": "round",
    "model.min_cluster_size": None,
    "model.n_init": 1,
    "model.kmeans_dims": 50,
    "model.n_probe": None,
    "privacy.epsilon": None,
    "privacy.delta": 0.0,
    "privacy.d": None,
    "privacy.dp_data": "noisy",
    "privacy.r_source": "passes",
    "privacy.r_value": None,
    "privacy.cluster_on": "noisy",
    "privacy.max_passes": 100,
    "privacy.budget": None,
    "partition.oversampling_factor": None,
    "partition.init_max_iter": 5,
    "partition.max_iter": 100,
    "partition.persist_fraction": 0.25,
    "evaluate.membership": True,
    "evaluate.max_train_rows": None,
    "report.plots": True,
    "cluster.scheduler": None,
    "cluster.config": None,
    "cluster.n_workers": 2,
    "cluster.threads_per_worker": 1,
    "cluster.memory_limit": "auto",
    "cluster.processes": True,
}


def _get(obj, dotted: str):
    for name in dotted.split("."):
        obj = getattr(obj, name)
    return obj


def _with(dotted: str, value) -> dict:
    """MINIMAL with ``dotted`` set to ``value`` (sections created as needed)."""
    return pipeline_dict(**{**BASE, dotted: value})


def _from(d: dict) -> PipelineConfig:
    return PipelineConfig.from_dict(d, base_dir=".", origin="pipelines/x.yaml")


@pytest.fixture
def in_tmp(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


# --------------------------------------------------------------------------- defaults


@pytest.mark.parametrize("dotted, expected", list(DEFAULTS.items()))
def test_every_default(dotted, expected):
    assert _get(_from(MINIMAL), dotted) == expected


def test_absent_or_null_privacy_is_non_private():
    for d in (MINIMAL, _with("privacy", None)):
        assert _from(d).privacy == PrivacyConfig()
        assert _from(d).privacy.epsilon is None


def test_synthetic_source_gets_default_block():
    cfg = _from(_with("data.source", "synthetic:blobs"))
    assert cfg.data.synthetic == SyntheticConfig()
    assert (cfg.data.synthetic.n_samples, cfg.data.synthetic.dtype) == (100_000, "float64")


# --------------------------------------------------------------------------- round trip


def test_full_yaml_loads_and_round_trips(in_tmp):
    (in_tmp / "pipelines").mkdir()
    path = in_tmp / "pipelines" / "full.yaml"
    path.write_text(FULL_YAML)
    cfg = load_config(path)

    assert cfg.output == in_tmp / "runs" / "full"
    assert cfg.privacy.delta == 1e-6 and isinstance(cfg.privacy.delta, float)  # YAML 1.2 number
    assert cfg.privacy.r_value == 12.0 and isinstance(cfg.privacy.r_value, float)
    assert cfg.partition.oversampling_factor == 40.0
    assert cfg.evaluate.membership is False  # YAML `no` is a real YAML bool
    assert cfg.data.synthetic == SyntheticConfig(
        n_samples=2000, n_features=8, n_classes=3, dtype="float32"
    )
    assert cfg.cluster.scheduler == "tcp://127.0.0.1:8786"

    d = cfg.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["output"] == str(in_tmp / "runs" / "full")
    assert PipelineConfig.from_dict(d, base_dir=in_tmp) == cfg


def test_config_is_frozen():
    cfg = _from(MINIMAL)
    with pytest.raises(AttributeError):
        cfg.seed = 1


# --------------------------------------------------------------------------- invalid cases

INVALID = [
    # unknown keys, named with the full dotted key
    ("model.n_componets", 3, "unknown key 'model.n_componets'"),
    ("colour", "red", "unknown key 'colour'"),
    ("data.synthetic.n_rows", 10, "unknown key 'data.synthetic.n_rows'"),
    ("cluster.adress", "tcp://x:1", "unknown key 'cluster.adress'"),
    # wrong types, named with the expected type
    ("name", 5, "'name'.*expected str"),
    ("seed", 1.5, "'seed'.*expected int"),
    ("seed", True, "'seed'.*expected int"),
    ("output", None, "'output'.*expected a path"),
    ("model.n_components", "20", "'model.n_components'.*expected int"),
    ("model.n_layers", False, "'model.n_layers'.*expected int"),
    ("data.chunk_rows", 2.0, "'data.chunk_rows'.*expected int or null"),
    ("privacy.epsilon", "1", "'privacy.epsilon'.*expected float or null"),
    ("privacy.delta", None, "'privacy.delta'.*expected float"),
    ("evaluate.membership", "yes", "'evaluate.membership'.*expected bool"),
    ("report.plots", 1, "'report.plots'.*expected bool"),
    ("cluster.processes", "true", "'cluster.processes'.*expected bool"),
    ("data.scale", 1, "'data.scale'.*expected one of"),
    ("model", [1, 2], "'model'.*expected a mapping"),
    # invalid values
    ("privacy.epsilon", 0, "'privacy.epsilon'.*> 0"),
    ("privacy.epsilon", -1.0, "'privacy.epsilon'.*> 0"),
    ("privacy.epsilon", float("inf"), "'privacy.epsilon'.*finite"),
    ("privacy.delta", -0.1, r"'privacy.delta'.*>= 0 and < 1"),
    ("privacy.delta", 1, r"'privacy.delta'.*>= 0 and < 1"),
    ("privacy.d", 0, "'privacy.d'.*> 0"),
    ("privacy.d", -2.0, "'privacy.d'.*> 0"),
    ("model.n_components", 0, "'model.n_components'.*>= 1"),
    ("model.block_size", -5, "'model.block_size'.*>= 1"),
    ("data.test_size", 0, r"'data.test_size'.*\(0, 1\)"),
    ("data.test_size", 1.0, r"'data.test_size'.*\(0, 1\)"),
    ("seed", -1, "'seed'.*>= 0"),
    ("privacy.max_passes", 0, "'privacy.max_passes'.*>= 1"),
    ("partition.oversampling_factor", 0, "'partition.oversampling_factor'.*> 0"),
    ("partition.persist_fraction", 1.0, "'partition.persist_fraction'.*>= 0 and < 1"),
    ("cluster.n_workers", 0, "'cluster.n_workers'.*>= 1"),
    ("cluster.memory_limit", "lots", "'cluster.memory_limit'.*'auto' or a size"),
    ("cluster.scheduler", "localhost:8786", "'cluster.scheduler'.*tcp://"),
    ("name", " ", "'name'.*empty"),
    # unknown enum values
    ("data.scale", "zscore", "'data.scale'.*one of 'minmax', 'none', 'tanh255'"),
    ("model.s_rule", "floor", "'model.s_rule'.*one of 'round', 'ceil'"),
    ("privacy.dp_data", "raw", "'privacy.dp_data'.*one of 'fabricated', 'noisy'"),
    ("privacy.r_source", "public", "'privacy.r_source'.*one of"),
    ("privacy.cluster_on", "both", "'privacy.cluster_on'.*one of 'noisy', 'original'"),
    ("data.source", "synthetic:moons", "'data.source'.*synthetic:blobs"),
    ("data.source", "sklearn:", "'data.source'.*sklearn:digits"),
    # r_value goes with r_source
    ("privacy.r_value", 3.0, "'privacy.r_value'.*'passes' needs an int"),
    # public bounds and the budget
    ("data.bounds", [0], r"'data.bounds'.*\[lower, upper\]"),
    ("data.bounds", [0, 1, 2], r"'data.bounds'.*\[lower, upper\]"),
    ("data.bounds", [1, 0], "'data.bounds'.*upper must exceed lower"),
    ("data.bounds", [[0, 0], [1, 0]], r"'data.bounds'.*upper must exceed lower \(feature 1\)"),
    ("data.bounds", [[0, 0], [1, 1, 1]], "'data.bounds'.*same length"),
    ("data.bounds", [0, "x"], r"'data.bounds'.*\[lower, upper\]"),
    ("data.bounds", [0, float("inf")], r"'data.bounds'.*\[lower, upper\]"),
    ("data.bounds", "0 1", "'data.bounds'.*expected a list or null"),
    ("privacy.budget", [1.0], "'privacy.budget'.*epsilon > 0"),
    ("privacy.budget", [0, 0], "'privacy.budget'.*epsilon > 0"),
    ("privacy.budget", [1, 1], "'privacy.budget'.*delta >= 0 and < 1"),
    # a block that only fits another source
    ("data.synthetic", {"n_samples": 10}, "'data.synthetic'.*synthetic:blobs"),
]


@pytest.mark.parametrize("dotted, value, message", INVALID)
def test_invalid_value_is_rejected_naming_the_key(dotted, value, message):
    with pytest.raises(ConfigError, match=message) as info:
        _from(_with(dotted, value))
    assert info.value.key == dotted
    assert "pipelines/x.yaml" in str(info.value)


@pytest.mark.parametrize(
    "privacy, key, message",
    [
        ({"r_source": "threshold"}, "privacy.r_value", "'threshold' needs a finite float >= 0"),
        ({"r_source": "threshold", "r_value": -0.5}, "privacy.r_value", ">= 0"),
        ({"r_source": "threshold", "r_value": "1"}, "privacy.r_value", "expected int or float"),
        ({"r_source": "passes", "r_value": 2.5}, "privacy.r_value", "'passes' needs an int"),
        ({"r_source": "private", "r_value": 3}, "privacy.r_value", "'private' computes r itself"),
        ({"r_source": "passes", "r_value": 0}, "privacy.r_value", ">= 1"),
        ({"r_source": "passes", "r_value": True}, "privacy.r_value", "expected int or float"),
    ],
)
def test_r_value_is_checked_against_r_source(privacy, key, message):
    with pytest.raises(ConfigError, match=message) as info:
        _from({**MINIMAL, "privacy": privacy})
    assert info.value.key == key


def test_r_value_accepted_forms():
    threshold = _from({**MINIMAL, "privacy": {"r_source": "threshold", "r_value": 0}}).privacy
    assert threshold.r_value == 0.0 and isinstance(threshold.r_value, float)
    passes = _from({**MINIMAL, "privacy": {"r_source": "passes", "r_value": 4}}).privacy
    assert passes.r_value == 4 and isinstance(passes.r_value, int)
    default = _from({**MINIMAL, "privacy": {"r_source": "passes"}}).privacy
    assert default.r_value is None  # DEFAULT_PASSES


def test_bounds_budget_and_pure_dp_accepted_forms():
    cfg = _from({**MINIMAL, "data": {"source": "sklearn:digits", "bounds": [0, 16]},
                 "privacy": {"epsilon": 1, "delta": 0, "budget": [4, 0]}})
    assert cfg.data.bounds == [0, 16] and cfg.privacy.delta == 0.0 and cfg.privacy.budget == [4, 0]
    per_feature = _from({**MINIMAL, "data": {"source": "sklearn:digits", "bounds": [0, [1, 2, 3]]}})
    assert per_feature.data.bounds == [0, [1, 2, 3]]
    assert PipelineConfig.from_dict(cfg.to_dict(), base_dir=".") == cfg


@pytest.mark.parametrize("missing", ["name", "output", "data"])
def test_required_top_level_keys(missing):
    d = {k: v for k, v in MINIMAL.items() if k != missing}
    with pytest.raises(ConfigError, match=f"missing required key '{missing}'"):
        _from(d)


def test_required_data_source():
    with pytest.raises(ConfigError, match="missing required key 'data.source'"):
        _from({**MINIMAL, "data": {"test_size": 0.2}})


def test_top_level_must_be_a_mapping():
    with pytest.raises(ConfigError, match="expected a mapping"):
        _from(["name", "x"])


def test_unknown_key_lists_valid_keys_and_suggests():
    with pytest.raises(ConfigError) as info:
        _from(_with("model.n_componets", 3))
    message = str(info.value)
    assert message.startswith("unknown key 'model.n_componets' in pipelines/x.yaml")
    assert "did you mean 'n_components'" in message
    assert "valid keys: n_components, n_layers, block_size, s_rule, min_cluster_size" in message


def test_scheduler_and_config_are_exclusive(in_tmp):
    (in_tmp / "c.yaml").write_text("kind: local\n")
    d = {**MINIMAL, "cluster": {"scheduler": "tcp://127.0.0.1:8786", "config": "c.yaml"}}
    with pytest.raises(ConfigError, match="'cluster.scheduler' and 'cluster.config'"):
        _from(d)


def test_direct_construction_is_validated():
    with pytest.raises(ConfigError, match="'model.n_components'.*>= 1"):
        ModelConfig(n_components=0)
    assert ModelConfig(n_components=3).n_components == 3


# --------------------------------------------------------------------------- YAML details


def test_yaml_bools_accepted_but_quoted_strings_rejected(in_tmp):
    (in_tmp / "a.yaml").write_text(
        "name: a\noutput: out\ndata: {source: 'sklearn:iris'}\nevaluate: {membership: yes}\n"
    )
    assert load_config(in_tmp / "a.yaml").evaluate.membership is True
    (in_tmp / "b.yaml").write_text(
        "name: b\noutput: out\ndata: {source: 'sklearn:iris'}\nevaluate: {membership: 'yes'}\n"
    )
    with pytest.raises(ConfigError, match=r"'evaluate.membership' in .*b.yaml: expected bool"):
        load_config(in_tmp / "b.yaml")


def test_yaml_duplicate_keys_and_syntax_errors(in_tmp):
    (in_tmp / "dup.yaml").write_text(
        "name: a\noutput: out\ndata: {source: 'sklearn:iris'}\nprivacy:\n  epsilon: 1\n  epsilon: 8\n"
    )
    with pytest.raises(ConfigError, match="duplicate key 'epsilon'"):
        load_config(in_tmp / "dup.yaml")
    (in_tmp / "bad.yaml").write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="cannot parse .*bad.yaml"):
        load_config(in_tmp / "bad.yaml")


def test_yaml_error_names_the_file(in_tmp):
    path = pipeline_file(in_tmp / "x.yaml", name="a", output="out", **{"model.n_componets": 3})
    with pytest.raises(ConfigError, match=re.escape(f"unknown key 'model.n_componets' in {path}")):
        load_config(in_tmp / "x.yaml")


# --------------------------------------------------------------------------- paths


def test_relative_paths_resolve_against_cwd(in_tmp):
    cfg = _from(_with("data.source", "data/x.npy, data/y.npy"))
    assert cfg.output == in_tmp / "runs" / "digits"
    assert cfg.data.source == f"{in_tmp / 'data' / 'x.npy'},{in_tmp / 'data' / 'y.npy'}"
    test = _from(_with("data.test_source", "test.npz")).data.test_source
    assert test == str(in_tmp / "test.npz")
    assert _from(MINIMAL).data.source == "sklearn:digits"


def test_cluster_config_found_next_to_the_yaml_file(in_tmp):
    pipelines = in_tmp / "pipelines"
    pipelines.mkdir()
    (pipelines / "slurm.yaml").write_text("kind: local\n")
    pipeline_file(pipelines / "p.yaml", name="p", output="out", **{"cluster.config": "slurm.yaml"})
    assert load_config(pipelines / "p.yaml").cluster.config == pipelines / "slurm.yaml"
    (in_tmp / "slurm.yaml").write_text("kind: local\n")  # the working directory comes first
    assert load_config(pipelines / "p.yaml").cluster.config == in_tmp / "slurm.yaml"


def test_missing_cluster_config_names_both_places(in_tmp):
    with pytest.raises(ConfigError, match="'cluster.config'.*looked in") as info:
        PipelineConfig.from_dict(_with("cluster.config", "nope.yaml"), base_dir=in_tmp / "pipelines")
    assert str(in_tmp / "pipelines" / "nope.yaml") in str(info.value)


# --------------------------------------------------------------------------- overrides


def test_with_overrides_replaces_dotted_keys():
    cfg = _from(MINIMAL)
    new = cfg.with_overrides(
        **{"cluster.scheduler": "tcp://10.0.0.1:8786", "privacy.epsilon": 1, "seed": 5}
    )
    assert new.cluster.scheduler == "tcp://10.0.0.1:8786"
    assert new.privacy.epsilon == 1.0 and new.seed == 5
    assert cfg.cluster.scheduler is None and cfg.seed is None  # the original is unchanged
    assert new.with_overrides() == new


def test_with_overrides_creates_optional_sections():
    cfg = _from(_with("data.source", "synthetic:blobs"))
    cfg = cfg.with_overrides(**{"data.synthetic.n_classes": 4})
    assert cfg.data.synthetic.n_classes == 4 and cfg.data.synthetic.n_samples == 100_000


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"model.n_componets": 3}, "unknown key 'model.n_componets' in the overrides"),
        ({"cluster.n_workers": 0}, "'cluster.n_workers' in the overrides.*>= 1"),
        ({"name.value": 1}, "cannot override 'name.value'.*'name' is a value"),
        ({"privacy.r_source": "threshold"}, "'privacy.r_value' in the overrides.*'threshold'"),
    ],
)
def test_with_overrides_validates(overrides, message):
    with pytest.raises(ConfigError, match=message):
        _from(MINIMAL).with_overrides(**overrides)


def test_override_paths_are_relative_to_cwd(in_tmp):
    (in_tmp / "local.yaml").write_text("kind: local\n")
    cfg = _from(MINIMAL).with_overrides(**{"cluster.config": "local.yaml", "output": "elsewhere"})
    assert cfg.cluster.config == in_tmp / "local.yaml"
    assert cfg.output == Path(os.getcwd()) / "elsewhere"


@pytest.mark.parametrize("name", sorted(p.name for p in PIPELINES.glob("*.yaml")))
def test_shipped_pipeline_files_are_valid(name):
    """Every pipeline file in pipelines/ loads and validates (the federated ones by their own
    schema); file sources need not exist until the run ingests them."""
    from kahm_dask.pipeline.config.sections import load_federated_config

    path = PIPELINES / name
    cfg = (load_federated_config if name.startswith("federated") else load_config)(path)
    assert cfg.name and cfg.output


DP_PIPELINES = {"quickstart.yaml": 64, "mnist_idx.yaml": 784}


def test_breast_cancer_pipeline_says_its_bounds_are_data_derived_and_warns():
    """Its "documented" bounds were the data set's own min/max rounded outward (6.9 against its
    minimum 6.981), labelled public: now the file says they are data-derived and the run warns."""
    from kahm_dask.pipeline.runs.data import feature_bounds
    from kahm_dask.privacy.bounds import BOUNDS_PRIVATE_SCALING
    from kahm_dask.privacy.randomness import PrivacyLeakWarning

    path = PIPELINES / "breast_cancer.yaml"
    assert "DATA-DERIVED" in path.read_text()
    cfg = load_config(path)
    assert cfg.data.bounds is None and cfg.data.scale == "minmax"
    with pytest.warns(PrivacyLeakWarning, match="private"):
        assert feature_bounds(cfg.data, 30).source == BOUNDS_PRIVATE_SCALING


@pytest.mark.parametrize("name", sorted(DP_PIPELINES))
def test_shipped_dp_pipelines_use_public_bounds(name):
    """No warning, and the feature bounds of the release are public."""
    import warnings

    from kahm_dask.pipeline.runs.data import feature_bounds
    from kahm_dask.privacy.bounds import BOUNDS_PUBLIC
    from kahm_dask.privacy.randomness import PrivacyLeakWarning

    cfg = load_config(PIPELINES / name)
    assert cfg.privacy.epsilon is not None and cfg.privacy.delta == 0
    assert cfg.privacy.r_source == "passes" and cfg.privacy.cluster_on == "noisy"
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        lower, upper, source, _ = feature_bounds(cfg.data, DP_PIPELINES[name])
    assert source == BOUNDS_PUBLIC and lower.shape == (DP_PIPELINES[name],)
    if name == "mnist_idx.yaml":
        import numpy as np

        np.testing.assert_allclose(upper, np.tanh(1.0)) and np.testing.assert_array_equal(lower, 0)


def test_large_synthetic_bounds_are_the_generators_range():
    cfg = load_config(PIPELINES / "large_synthetic.yaml")
    assert cfg.data.bounds == [0, 1] and cfg.data.scale == "none"


def test_own_npz_template_asks_for_bounds():
    text = (PIPELINES / "own_npz.yaml").read_text()
    assert "# bounds: [0, 255]" in text and "FILL IN" in text
    cfg = load_config(PIPELINES / "own_npz.yaml")
    assert cfg.data.bounds is None  # until the owner fills it in: the warning path


def test_synthetic_generator_directions_and_its_checks():
    cfg = _from(_with("data.source", "synthetic:blobs"))
    assert cfg.data.synthetic.generator == "blobs"  # the existing pipelines keep their data
    cfg = cfg.with_overrides(**{"data.synthetic.generator": "directions", "data.synthetic.amplitude": 0.2,
                                "data.synthetic.n_directions": 8})
    syn = cfg.data.synthetic
    assert (syn.generator, syn.amplitude, syn.n_directions) == ("directions", 0.2, 8)
    with pytest.raises(ConfigError, match="data.synthetic.generator"):
        cfg.with_overrides(**{"data.synthetic.generator": "spheres"})
    with pytest.raises(ConfigError, match="'data.synthetic.n_directions'.*n_features"):
        cfg.with_overrides(**{"data.synthetic.n_features": 4})
    with pytest.raises(ConfigError, match="'data.synthetic.amplitude'"):
        cfg.with_overrides(**{"data.synthetic.amplitude": -0.5})
