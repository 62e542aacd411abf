"""Bad input in a pipeline YAML file (docs/reliability.md §1): each mistake is a ConfigError naming
the key, the rule and the file (tests/pipeline/config/test_config.py has the schema itself)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kahm_dask.pipeline.config import ConfigError, load_config
from tests._kit import pipeline_file

#: Each case: overrides of the minimal pipeline file (tests._kit.pipeline_file), or YAML text
#: appended to it where a mapping cannot say it (a duplicate key), and the pattern of the error.
YAML = {
    "unknown top-level key": ({"seeed": 3}, r"unknown key 'seeed'.*did you mean 'seed'"),
    "unknown section key": ({"model.n_componets": 3}, r"unknown key 'model.n_componets'.*did you mean 'n_components'"),
    "unknown nested key": ({"data.source": "synthetic:blobs", "data.synthetic.n_sampels": 10},
                           r"unknown key 'data.synthetic.n_sampels'"),
    "unknown section": ({"privcy.epsilon": 1.0}, r"unknown key 'privcy'.*did you mean 'privacy'"),
    "epsilon = 0": ({"privacy.epsilon": 0}, r"'privacy.epsilon'.*must be > 0 \(at least 2\.8e-13\) and at .*, got 0"),
    "epsilon 1e6": ({"privacy.epsilon": 1e6}, r"'privacy.epsilon'.*must be > 0 .* at most 709\.783 .*, got 1000000"),
    "epsilon < 0": ({"privacy.epsilon": -1.5}, r"'privacy.epsilon'.*must be > 0 \(at least 2\.8e-13\) .*, got -1.5"),
    "epsilon nan": ({"privacy.epsilon": float("nan")}, r"'privacy.epsilon'.*must be a finite number"),
    "epsilon string": ({"privacy.epsilon": "two"}, r"wrong type for 'privacy.epsilon'.*expected float or null"),
    "delta < 0": ({"privacy.epsilon": 1.0, "privacy.delta": -0.1},
                  r"'privacy.delta'.*: must be >= 0 and < 1, got -0.1"),
    "delta = 1": ({"privacy.epsilon": 1.0, "privacy.delta": 1}, r"'privacy.delta'.*: must be >= 0 and < 1, got 1"),
    "delta > 1": ({"privacy.epsilon": 1.0, "privacy.delta": 2.5}, r"'privacy.delta'.*: must be >= 0 and < 1"),
    "bounds not a pair": ({"data.bounds": [0]}, r"'data.bounds'.*\[lower, upper\]"),
    "d = 0": ({"privacy.epsilon": 1.0, "privacy.d": 0}, r"'privacy.d'.*: must be > 0, got 0"),
    "d < 0": ({"privacy.epsilon": 1.0, "privacy.d": -2}, r"'privacy.d'.*: must be > 0"),
    "n_components = 0": ({"model.n_components": 0}, r"'model.n_components'.*: must be >= 1, got 0"),
    "n_components float": ({"model.n_components": 2.5}, r"wrong type for 'model.n_components'.*expected int"),
    "n_layers = 0": ({"model.n_layers": 0}, r"'model.n_layers'.*: must be >= 1"),
    "block_size = 0": ({"model.block_size": 0}, r"'model.block_size'.*: must be >= 1"),
    "duplicate key": ("model:\n  n_layers: 2\n  n_layers: 3\n", r"duplicate key 'n_layers'"),
    "r_value with private r": ({"privacy.epsilon": 1.0, "privacy.r_source": "private", "privacy.r_value": 0.5},
                               r"'privacy.r_value'.*remove r_value"),
    "fractional passes": ({"privacy.epsilon": 1.0, "privacy.r_value": 0.5},
                          r"'privacy.r_value'.*'passes' needs an int"),
    "budget not a pair": ({"privacy.epsilon": 1.0, "privacy.budget": 2},
                          r"wrong type for 'privacy.budget'.*expected a list"),
    "budget delta = 1": ({"privacy.epsilon": 1.0, "privacy.budget": [2, 1]}, r"'privacy.budget'.*delta >= 0 and < 1"),
    "test_size = 1": ({"data.test_size": 1.0}, r"'data.test_size'.*: must be in \(0, 1\)"),
}


def _yaml(tmp: Path, case: dict | str) -> Path:
    """The pipeline file ``tmp/p.yaml`` of a case (see :data:`YAML`)."""
    if isinstance(case, str):
        path = pipeline_file(tmp / "p.yaml", name="t")
        path.write_text(path.read_text() + case)
        return path
    return pipeline_file(tmp / "p.yaml", name="t", **case)


@pytest.mark.parametrize("case,pattern", list(YAML.values()), ids=list(YAML))
def test_yaml_rejects(case, pattern, tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(_yaml(tmp_path, case))
    assert re.search(pattern, str(info.value)), str(info.value)
    assert str(tmp_path / "p.yaml") in str(info.value)  # the file is named
