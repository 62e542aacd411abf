"""The parameter table (kahm_dask/params.py) is the one source of every rule.

The cases are derived from the table: for each parameter, values at and around the ends of its
range, its choices and a wrong value, values of a wrong type and None; for ``r_value``, the same
under each ``r_source`` (``R_VALUE_RULES``). Each case must be accepted, or rejected naming the
parameter, alike by every place that takes the parameter: the estimator, the pipeline YAML
schema, the ``kahm-dask train`` options and the core functions that check it. A rule changed
in the table changes the cases; a rule added anywhere else breaks them.
"""

from __future__ import annotations

import dataclasses
import math
from numbers import Integral
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from sklearn.utils._param_validation import make_constraint

from kahm_dask import KAHM, DeepKAHM, KAHMClassifier, WideKAHM
from kahm_dask.cli import main
from kahm_dask.params import PARAMS, R_VALUE_RULES, Choices, Range, check_estimator_params
from kahm_dask.partition import n_branches
from kahm_dask.pipeline.config import ConfigError, ModelConfig, PartitionConfig, PipelineConfig, PrivacyConfig
from kahm_dask.pipeline.stores.dataset import write_dataset
from kahm_dask.privacy.fabrication import _check_fabrication_options
from tests._kit import pipeline_dict

#: Options of ``kahm-dask train`` that are not model or privacy parameters.
CLI_OTHER = {"store", "model", "work", "budget", "scheduler", "cluster_config", "n_workers", "memory_limit",
             "tls_ca_file", "tls_cert", "tls_key", "storage_options", "ledger_dir", "dashboard_address"}
#: Core functions that check parameters themselves, by the parameters they take.
FUNCTIONS = {
    "n_branches": (lambda p: n_branches(100, p.get("block_size", 1000), p.get("s_rule", "round")),
                   {"block_size", "s_rule"}),
    "fabricate_partitioned": (lambda p: _check_fabrication_options(p.get("r_source", "passes"), p.get("r_value"),
                                                                   p.get("cluster_on", "noisy")),
                              {"r_source", "r_value", "cluster_on"}),
}

X, Y = np.random.default_rng(0).uniform(size=(20, 3)), np.repeat([0, 1], 10)
TRAIN = main.commands["train"]


def _config_keys() -> dict[str, str]:
    """Table parameter → dotted key in the pipeline YAML."""
    keys = {}
    sections = ((PipelineConfig, ""), (ModelConfig, "model."), (PrivacyConfig, "privacy."),
                (PartitionConfig, "partition."))
    for section, prefix in sections:
        for f in dataclasses.fields(section):
            name = f.metadata.get("param")  # the field's parameter (schema.param), whatever its YAML key
            if name is not None:
                keys[name] = prefix + f.name
    return keys


def _cli_options() -> dict[str, Any]:
    """Table parameter → click option of ``kahm-dask train``."""
    return {o.name: o for o in TRAIN.params if o.name not in CLI_OTHER}


CONFIG_KEYS, CLI_OPTIONS = _config_keys(), _cli_options()
#: The estimators that check table parameters, by the parameters they take.
ESTIMATORS = {cls: set(cls().get_params()) for cls in (KAHMClassifier, KAHM, DeepKAHM, WideKAHM)}


# --------------------------------------------------------------------------- the cases


def _candidates(rule: tuple) -> list:
    """None, and for each choice or range of ``rule`` values inside, outside and of wrong types."""
    out: list = [None]
    for c in rule:
        if isinstance(c, Choices):
            out += [*c.choices, "not-" + c.choices[0], c.choices[0].upper(), 1]
        elif isinstance(c, Range):
            ends = [e for e in (c.left, c.right) if e is not None]
            step = 1 if c.type is Integral else 0.5
            out += [e + k * step for e in ends for k in (-1, 0, 1)]
            out += [ends[0] + 0.5, float(ends[0] + 1)] if c.type is Integral else [math.inf, math.nan]
            out += [True, str(ends[0] + 1)]
    unique = {repr(v): v for v in out}
    return list(unique.values())


def _valid(rule: tuple, value: Any) -> bool:
    return any(make_constraint(c).is_satisfied_by(value) for c in rule)


def _r_value_rule(r_source: str) -> tuple:
    rule = R_VALUE_RULES[r_source]
    return ((None,) if rule.optional or rule.values is None else ()) + ((rule.values,) if rule.values else ())


def _outcome(params: dict) -> tuple[bool, str]:
    """Whether the table accepts ``params`` (the other parameters at their defaults), and the
    parameter a rejection must name."""
    for key, value in params.items():
        if key != "r_value" and not _valid(PARAMS[key].rule, value):
            return False, key
    return _valid(_r_value_rule(params.get("r_source", "passes")), params.get("r_value")), "r_value"


def _cases() -> list:
    cases = [{name: v} for name, param in PARAMS.items() if name != "r_value" for v in _candidates(param.rule)]
    every = _candidates(tuple(r.values for r in R_VALUE_RULES.values() if r.values is not None))
    cases += [{"r_source": source, "r_value": v} for source in R_VALUE_RULES for v in every]
    return [pytest.param(params, *_outcome(params), id=",".join(f"{k}={v!r}" for k, v in params.items()))
            for params in cases]


CASES = _cases()


# --------------------------------------------------------------------------- the places


def _estimator(params: dict, name: str, valid: bool, cls: type) -> None:
    if valid:
        if cls is KAHMClassifier:
            cls(**params)._check_params()
        else:
            check_estimator_params(cls(**params))
    else:
        with pytest.raises((ValueError, TypeError), match=f"'{name}' parameter of {cls.__name__}"):
            cls(**params).fit(X, Y)


def _config(params: dict, name: str, valid: bool) -> None:
    d = pipeline_dict(**{CONFIG_KEYS[key]: value for key, value in params.items()})
    if valid:
        PipelineConfig.from_dict(d, base_dir=".")
    else:
        with pytest.raises(ConfigError) as info:
            PipelineConfig.from_dict(d, base_dir=".")
        assert info.value.key == CONFIG_KEYS[name], str(info.value)


class _Reached(Exception):
    """The command validated its arguments and went on to start a cluster."""


def _cli_args(params: dict) -> list[str] | None:
    """The command-line arguments of ``params``, or None when a value cannot be typed there (a
    number is text: ``2.0`` is ``2``, ``"1"`` is 1, and there is no ``True``; None is
    the option's absence, where that means None)."""
    args = []
    for key, value in params.items():
        option = CLI_OPTIONS[key]
        if value is None:
            if option.default is not None:
                return None
            continue
        if isinstance(value, bool) or isinstance(value, str) != bool(PARAMS[key].choices):
            return None
        if isinstance(value, float) and value.is_integer():
            return None
        args += [option.opts[0], str(value)]
    return args


def _cli(params: dict, name: str, valid: bool, store, monkeypatch) -> None:
    args = _cli_args(params)
    if args is None:
        pytest.skip("not a value of the command line")

    def reached(cfg):
        raise _Reached

    monkeypatch.setattr("kahm_dask.cli.session.connect", reached)
    result = CliRunner().invoke(main, ["train", str(store), str(store.parent / "m.zarr"), *args])
    if valid:
        assert isinstance(result.exception, _Reached), result.output
    else:
        assert result.exit_code in (1, 2) and "Traceback" not in result.output, result.output
        flag = CLI_OPTIONS[name].opts[0]
        assert f"'{flag}'" in result.output or f"'{CONFIG_KEYS[name]}'" in result.output, result.output


def _function(params: dict, name: str, valid: bool, function: str) -> None:
    call, _ = FUNCTIONS[function]
    if valid:
        call(params)
    else:
        with pytest.raises((ValueError, TypeError), match=f"'{name}' parameter of {function}"):
            call(params)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("params") / "s.zarr", X, Y, chunk_rows=10).path


@pytest.mark.parametrize("params, valid, name", CASES)
def test_every_place_applies_the_table(params, valid, name, store, monkeypatch):
    checked = 0
    for cls, takes in ESTIMATORS.items():
        if set(params) <= takes:
            _estimator(params, name, valid, cls)
            checked += 1
    if set(params) <= set(CONFIG_KEYS):
        _config(params, name, valid)
        checked += 1
    for function, (_, takes) in FUNCTIONS.items():
        if set(params) <= takes:
            _function(params, name, valid, function)
            checked += 1
    if set(params) <= set(CLI_OPTIONS) and _cli_args(params) is not None:
        _cli(params, name, valid, store, monkeypatch)
        checked += 1
    assert checked, f"{name} is taken nowhere"


# --------------------------------------------------------------------------- coverage


def test_every_model_and_privacy_setting_has_a_rule():
    """A parameter added to the estimator, the YAML sections ``model`` and ``privacy`` or the
    train command needs a rule in the table first."""
    for cls, takes in ESTIMATORS.items():
        assert takes == set(cls._parameter_constraints) <= set(PARAMS), cls.__name__
    for section in (ModelConfig, PrivacyConfig):
        names = {f.metadata.get("param", f.name) for f in dataclasses.fields(section)} - {"budget", "ledger_dir"}
        assert names <= set(PARAMS), names - set(PARAMS)
    assert set(CLI_OPTIONS) <= set(PARAMS), set(CLI_OPTIONS) - set(PARAMS)


def test_every_rule_is_used():
    used = set().union(*ESTIMATORS.values()) | set(CONFIG_KEYS) | set(CLI_OPTIONS)
    assert set(PARAMS) <= used, set(PARAMS) - used
    assert all(param.meaning for param in PARAMS.values())


@pytest.mark.parametrize("source", list(R_VALUE_RULES))
def test_r_value_rules_lie_in_the_r_value_range(source):
    """Every r_value a source accepts passes the plain rule of r_value (which the estimator's
    ``_parameter_constraints`` check before the cross-field rule)."""
    values = R_VALUE_RULES[source].values
    if values is not None:
        base = PARAMS["r_value"].range
        assert values.left >= base.left and values.right is None and base.right is None


def test_messages_name_parameter_value_and_allowed():
    with pytest.raises(ValueError) as info:
        KAHMClassifier(n_components=0).fit(X, Y)
    assert str(info.value) == "The 'n_components' parameter of KAHMClassifier must be an int >= 1. Got 0 instead."
    with pytest.raises(ValueError) as info:
        KAHMClassifier(r_source="passes", r_value=2.5).fit(X, Y)
    assert str(info.value) == (
        "The 'r_value' parameter of KAHMClassifier is invalid: r_source 'passes' needs an int >= 1 "
        "(the number of smoother passes) or no r_value (the default). Got 2.5 instead."
    )
    with pytest.raises(ConfigError) as info:
        PrivacyConfig(delta=1.0)
    assert str(info.value) == "invalid value for 'privacy.delta': must be >= 0 and < 1, got 1.0"
