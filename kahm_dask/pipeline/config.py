"""The pipeline YAML schema: frozen dataclasses, strict validation, loading, overrides.

A pipeline file (``pipelines/*.yaml``) has the sections ``data``, ``model``, ``privacy``,
``partition``, ``evaluate``, ``report`` and ``cluster`` next to the top-level keys ``name``,
``seed`` and ``output``; each section is one frozen dataclass below, whose fields, types and
defaults *are* the schema. Validation is strict and happens on every construction (also
when the dataclasses are built directly in Python):

* unknown keys are rejected, naming the full dotted key and the valid keys;
* types are exact: booleans must be booleans, integers must not be booleans, floats
  accept integers; a wrong type is named with the expected type;
* invalid values (``privacy.epsilon <= 0``, ``data.test_size`` outside (0, 1), an unknown
  ``data.scale``, ...) are named with the allowed range. The ranges and choices of the model
  and privacy parameters, and the rule tying ``privacy.r_value`` to ``privacy.r_source``, are
  those of :mod:`kahm_dask.params` (shared with the estimator and the CLI).

YAML is read with PyYAML's safe loader, changed in two ways: numbers follow YAML 1.2, so
``1e-5`` is a float (YAML 1.1 reads it as a string) and ``1:30`` is a string (not the
sexagesimal integer 90); and duplicate keys are an error instead of "last one wins".

**Relative paths** (``output``, file paths in ``data.source`` and ``data.test_source``,
``cluster.config``) are resolved against the *current working directory* when the config
is loaded, and stored absolute. One exception: ``cluster.config`` is looked up relative
to the YAML file's directory if it does not exist relative to the working directory, so a
pipeline file can name a cluster config next to it.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import os
import re
import types
import typing
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from dask.utils import parse_bytes

from kahm_dask.params import PARAMS, Range, RuleError, check_r_value
from kahm_dask.partition import KMEANS_DIMS

__all__ = [
    "ConfigError",
    "PipelineConfig",
    "DataConfig",
    "SyntheticConfig",
    "ModelConfig",
    "PrivacyConfig",
    "PartitionConfig",
    "EvaluateConfig",
    "ReportConfig",
    "ClusterConfig",
    "load_config",
]

SYNTHETIC_SOURCE = "synthetic:blobs"
SKLEARN_PREFIX = "sklearn:"

Scale = Literal["minmax", "none", "tanh255"]
Dtype = Literal["float32", "float64"]
# the choices of the model and privacy parameters (kahm_dask/params.py)
SRule = Literal[PARAMS["s_rule"].choices]
DpData = Literal[PARAMS["dp_data"].choices]
RSource = Literal[PARAMS["r_source"].choices]
ClusterOn = Literal[PARAMS["cluster_on"].choices]
EvalDtype = Literal[PARAMS["eval_dtype"].choices]


class ConfigError(ValueError):
    """An invalid configuration value or key; the message names the dotted key.

    ``key`` is the dotted key at fault (or None), ``origin`` the file or source it came from.
    The message is ``<subject> in <origin><detail>``, e.g. ``unknown key
    'model.n_componets' in pipelines/x.yaml; valid keys: n_components, ...``.
    """

    def __init__(
        self, subject: str, detail: str = "", *, key: str | None = None, origin: str | None = None
    ) -> None:
        self.subject, self.detail, self.key, self.origin = subject, detail, key, origin
        where = f" in {origin}" if origin else ""
        super().__init__(f"{subject}{where}{detail}")

    def located(self, origin: str) -> ConfigError:
        """This error with ``origin`` filled in (unchanged if it already has one)."""
        if self.origin is not None:
            return self
        return ConfigError(self.subject, self.detail, key=self.key, origin=origin)


# --------------------------------------------------------------------------- errors


def invalid_value(key: str, reason: str, value: Any) -> ConfigError:
    """``invalid value for '<key>': <reason>, got <value>``."""
    return ConfigError(f"invalid value for '{key}'", f": {reason}, got {value!r}", key=key)


def _wrong_type(key: str, expected: str, value: Any) -> ConfigError:
    got = "null" if value is None else f"{type(value).__name__} {value!r}"
    return ConfigError(f"wrong type for '{key}'", f": expected {expected}, got {got}", key=key)


def _unknown_key(key: str, name: Any, valid: list[str]) -> ConfigError:
    close = difflib.get_close_matches(str(name), valid, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return ConfigError(f"unknown key '{key}'", f"{hint}; valid keys: {', '.join(valid)}", key=key)


def _join_key(prefix: str, name: Any) -> str:
    """Dotted key of ``name`` inside the section ``prefix`` ("" = top level)."""
    return f"{prefix}.{name}" if prefix else str(name)


# --------------------------------------------------------------------------- type checks


class _Mismatch(Exception):
    """Internal: a value does not have the type of one hint (the caller names the key)."""


def _members(hint: Any) -> tuple[Any, ...]:
    """The members of a union hint, or ``(hint,)``."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        return typing.get_args(hint)
    return (hint,)


def _type_name(hint: Any) -> str:
    """Readable name of a type hint for error messages."""
    if len(_members(hint)) > 1:
        return " or ".join(_type_name(a) for a in _members(hint))
    origin = typing.get_origin(hint)
    if hint is list:
        return "a list"
    names = {
        type(None): "null",
        bool: "bool (true or false)",
        Path: "a path (non-empty str)",
        list: "a list of strings",
        dict: "a mapping with string keys",
    }
    if origin is Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(hint)))
    if isinstance(hint, type) and issubclass(hint, Section):
        return "a mapping"
    return names.get(origin or hint, getattr(hint, "__name__", str(hint)))


def _check_scalar(value: Any, hint: Any, key: str) -> Any:
    """Check ``value`` against a non-union hint and return it normalized.

    Raises ``_Mismatch`` for a wrong type and ConfigError for a wrong value.
    """
    origin = typing.get_origin(hint)
    if origin is Literal:
        if not isinstance(value, str):
            raise _Mismatch
        if value not in typing.get_args(hint):
            raise invalid_value(key, f"expected {_type_name(hint)}", value)
        return value
    if origin is list:
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise _Mismatch
        return list(value)
    if origin is dict:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise _Mismatch
        return dict(value)
    if hint is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise _Mismatch
        if not math.isfinite(value):
            raise invalid_value(key, "must be a finite number", value)
        return float(value)
    if hint is int and isinstance(value, bool):
        raise _Mismatch
    if hint is Path:
        if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
            raise _Mismatch
        return Path(os.path.abspath(os.path.expanduser(value)))
    if not isinstance(value, hint):  # bool, int, str, or a nested section
        raise _Mismatch
    return value


def _check_value(value: Any, hint: Any, key: str) -> Any:
    """Check ``value`` against the type hint ``hint`` and return it normalized.

    Union members are tried in order, so ``int | float`` keeps ints as ints.
    """
    for member in _members(hint):
        if member is type(None):
            if value is None:
                return None
            continue
        try:
            return _check_scalar(value, member, key)
        except _Mismatch:
            continue
    raise _wrong_type(key, _type_name(hint), value)


# --------------------------------------------------------------------------- value checks


def within(values: Range) -> dict:
    """Field metadata: a non-null value must lie in ``values``."""
    reason = f"must be {values.bounds_text()}"

    def check(value: Any, key: str) -> None:
        if value not in values:
            raise invalid_value(key, reason, value)

    return {"check": check}


def bound(*, gt: float | None = None, ge: float | None = None, lt: float | None = None) -> dict:
    """Field metadata: a non-null value must be ``> gt`` (or ``>= ge``) and ``< lt`` (if given)."""
    return within(Range(Real, gt if ge is None else ge, lt, closed="neither" if ge is None else "left"))


def rule(name: str) -> dict:
    """Field metadata: the range of the model/privacy parameter ``name`` (kahm_dask/params.py)."""
    return within(PARAMS[name].range)


def _check_memory(value: str, key: str) -> None:
    if value == "auto":
        return
    try:
        parse_bytes(value)
    except (ValueError, TypeError):
        reason = "expected 'auto' or a size such as '2GiB' or '500MB'"
        raise invalid_value(key, reason, value) from None


def _check_address(value: str, key: str) -> None:
    if not re.fullmatch(r"[a-z][a-z0-9+.-]*://\S+", value):
        raise invalid_value(
            key, "expected a scheduler address with protocol, such as 'tcp://127.0.0.1:8786'", value
        )


MEMORY = {"check": _check_memory}
ADDRESS = {"check": _check_address}

#: The dashboard of a local cluster: this machine's loopback interface only.
DASHBOARD = "127.0.0.1:8787"
_LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def dashboard_is_local(address: str) -> bool:
    """Whether a dashboard address ``host:port`` listens on the loopback interface only (an
    empty host, as in ``:8787``, means every interface)."""
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return host in _LOOPBACK


def _check_dashboard(value: str, key: str) -> None:
    if not re.fullmatch(r"(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]*):\d{1,5}", value):
        raise invalid_value(key, "expected host:port, such as '127.0.0.1:8787' (null: no dashboard)", value)


DASHBOARD_RULE = {"check": _check_dashboard}


# --------------------------------------------------------------------------- sections


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@dataclass(frozen=True, kw_only=True)
class Section:
    """Base of every schema dataclass: validates and normalizes its fields on construction.

    Subclasses set ``_key``, the dotted prefix of their keys ("" at the top level), declare
    fields with type hints (the expected types), put value checks in the field metadata
    (``bound``, ``MEMORY``, ``ADDRESS``) and cross-field checks in ``_validate``. The
    cluster config schema (``cluster.py``) is built from the same pieces.
    """

    _key: ClassVar[str] = ""

    def __post_init__(self) -> None:
        hints = _hints(type(self))
        for f in dataclasses.fields(self):
            key = _join_key(self._key, f.name)
            value = _check_value(getattr(self, f.name), hints[f.name], key)
            if value is not None and "check" in f.metadata:
                f.metadata["check"](value, key)
            object.__setattr__(self, f.name, value)
        self._validate()

    def _validate(self) -> None:
        """Cross-field checks and normalization after the field checks; none by default."""

    @classmethod
    def from_mapping(cls, raw: Any) -> typing.Self:
        """Build the section from a parsed YAML mapping (None = all defaults)."""
        raw = {} if raw is None else raw
        if not isinstance(raw, Mapping):
            if not cls._key:
                raise ConfigError("wrong top-level type", f": expected a mapping, got {raw!r}")
            raise _wrong_type(cls._key, "a mapping", raw)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for name in raw:
            if name not in fields:
                raise _unknown_key(_join_key(cls._key, name), name, list(fields))
        for f in fields.values():
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            if required and f.name not in raw:
                key = _join_key(cls._key, f.name)
                raise ConfigError(f"missing required key '{key}'", "; it has no default", key=key)
        kwargs = {name: _nested(_hints(cls)[name], value) for name, value in raw.items()}
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """The section as plain JSON-able data (paths as str); ``from_mapping`` inverts it."""
        return _plain(dataclasses.asdict(self))


def _nested(hint: Any, value: Any) -> Any:
    """Parse ``value`` as a nested section if ``hint`` is one (or an optional one)."""
    members = _members(hint)
    sections = [m for m in members if isinstance(m, type) and issubclass(m, Section)]
    if not sections or (value is None and type(None) in members):
        return value
    return sections[0].from_mapping(value)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


# --------------------------------------------------------------------------- the schema


@dataclass(frozen=True, kw_only=True)
class SyntheticConfig(Section):
    """``data.synthetic``: Gaussian blobs, only for ``data.source: synthetic:blobs``."""

    _key: ClassVar[str] = "data.synthetic"
    n_samples: int = field(default=100_000, metadata=bound(ge=1))
    n_features: int = field(default=64, metadata=bound(ge=1))
    n_classes: int = field(default=10, metadata=bound(ge=2))
    dtype: Dtype = "float64"

    def _validate(self) -> None:
        if self.n_samples < self.n_classes:
            raise invalid_value(
                "data.synthetic.n_samples", f"must be >= n_classes ({self.n_classes})", self.n_samples
            )


@dataclass(frozen=True, kw_only=True)
class DataConfig(Section):
    """``data``: where the rows come from, how they are split and scaled.

    ``source`` (and ``test_source``) is one of ``sklearn:<name>``, ``path.npz``,
    ``path.csv``, ``x.npy,y.npy``, ``images.idx3-ubyte[.gz],labels.idx1-ubyte[.gz]``, an
    existing dataset ``.zarr`` store, or ``synthetic:blobs``; file paths are made absolute.
    Without ``test_source`` a stratified ``test_size`` split (seed ``split_seed``) is used.

    ``bounds: [lower, upper]`` (each a number or a list of one number per feature) is the
    *public* range of the raw features, known without looking at the data (pixels 0–255, an
    instrument's range); raw rows are clipped to it. ``scale``: ``minmax`` maps ``bounds`` to
    [0, 1] (without ``bounds``: the training split's min/max, which are private);
    ``tanh255`` = tanh(pixel/255) with raw bounds [0, 255] unless ``bounds`` says otherwise;
    ``none`` keeps the raw values (the feature bounds are ``bounds``, or the training split's
    private min/max). See :func:`kahm_dask.pipeline.data.feature_bounds`.
    """

    _key: ClassVar[str] = "data"
    source: str
    test_source: str | None = None
    test_size: float = field(default=0.3, metadata=bound(gt=0, lt=1))
    split_seed: int = field(default=0, metadata=bound(ge=0))
    scale: Scale = "minmax"
    bounds: list | None = field(default=None, metadata={"check": lambda v, k: _check_bounds(v, k)})
    chunk_rows: int | None = field(default=None, metadata=bound(ge=1))
    synthetic: SyntheticConfig | None = None

    def _validate(self) -> None:
        for name in ("source", "test_source"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _resolve_source(value, f"data.{name}"))
        if self.source == SYNTHETIC_SOURCE and self.synthetic is None:
            object.__setattr__(self, "synthetic", SyntheticConfig())
        if self.source != SYNTHETIC_SOURCE and self.synthetic is not None:
            raise ConfigError(
                "unexpected block 'data.synthetic'",
                f": it is only used with data.source '{SYNTHETIC_SOURCE}'"
                f" (data.source is {self.source!r}); remove it",
                key="data.synthetic",
            )


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_bounds(value: list, key: str) -> None:
    """``[lower, upper]``: each a finite number or a non-empty list of finite numbers; lists of
    both sides have the same length, and upper > lower everywhere."""
    reason = "expected [lower, upper], each a number or a list of one number per feature"
    if len(value) != 2:
        raise invalid_value(key, reason, value)
    sides = []
    for side in value:
        if _number(side):
            sides.append([float(side)])
        elif isinstance(side, (list, tuple)) and side and all(_number(v) for v in side):
            sides.append([float(v) for v in side])
        else:
            raise invalid_value(key, reason, value)
    lower, upper = sides
    if len(lower) > 1 and len(upper) > 1 and len(lower) != len(upper):
        raise invalid_value(key, "lower and upper lists must have the same length", value)
    n = max(len(lower), len(upper))
    lower, upper = lower * (n if len(lower) == 1 else 1), upper * (n if len(upper) == 1 else 1)
    bad = [j for j in range(n) if not upper[j] > lower[j]]
    if bad:
        raise invalid_value(key, f"upper must exceed lower (feature {bad[0]})", value)


def _resolve_source(source: str, key: str) -> str:
    """Make the file paths of a data source absolute; check the named forms."""
    if source.startswith("synthetic:"):
        if source != SYNTHETIC_SOURCE:
            raise invalid_value(key, f"the only synthetic source is '{SYNTHETIC_SOURCE}'", source)
        return source
    if source.startswith(SKLEARN_PREFIX):
        if not source[len(SKLEARN_PREFIX) :]:
            raise invalid_value(key, "name the data set, e.g. 'sklearn:digits'", source)
        return source
    parts = [p.strip() for p in source.split(",")]
    if not all(parts):
        raise invalid_value(key, "expected a path or two comma-separated paths", source)
    return ",".join(os.path.abspath(os.path.expanduser(p)) for p in parts)


@dataclass(frozen=True, kw_only=True)
class ModelConfig(Section):
    """``model``: the DeepKAHM of each cluster, the partition into clusters (``n_init``,
    ``kmeans_dims``: the k-means of a class partitioned in one task), the routing of
    predictions (``n_probe``: clusters per class a query meets; null: all) and their precision
    (``eval_dtype``: float64 or float32 kernel blocks, docs/algorithm.md#evaluation-precision)."""

    _key: ClassVar[str] = "model"
    n_components: int = field(default=20, metadata=rule("n_components"))
    n_layers: int = field(default=1, metadata=rule("n_layers"))
    block_size: int = field(default=1000, metadata=rule("block_size"))
    s_rule: SRule = "round"
    min_cluster_size: int | None = field(default=None, metadata=rule("min_cluster_size"))
    n_init: int = field(default=1, metadata=rule("n_init"))
    kmeans_dims: int | None = field(default=KMEANS_DIMS, metadata=rule("kmeans_dims"))
    n_probe: int | None = field(default=None, metadata=rule("n_probe"))
    eval_dtype: EvalDtype = "float64"


@dataclass(frozen=True, kw_only=True)
class PrivacyConfig(Section):
    """``privacy``: element-level DP noise and fabrication; ``epsilon: null`` = non-private.

    A missing ``privacy`` block or ``privacy: null`` gives these defaults (non-private).
    ``delta`` 0 (the default) is pure ε-DP. ``d`` (the largest change of one entry that is
    covered) is in the raw units of ``data.bounds`` (e.g. 16 for digits counted 0–16) and
    defaults to their width; the run turns it into the units of the scaled features and the
    privacy statement prints both. ``r_value`` goes
    with ``r_source``: for ``passes`` (the default) an int >= 1, the fixed number of smoothing
    passes (null: :data:`~kahm_dask.privacy.fabrication.DEFAULT_PASSES`); a float >= 0 (the
    error threshold r per row) for ``threshold``; null for ``private`` (r computed from the
    private rows: leaks, warns). ``cluster_on: original`` (k-means on the private rows) leaks
    too and warns. ``budget: [epsilon, delta]`` caps the training data's privacy ledger: it
    lowers a stored budget (never raises it) and a release beyond it is refused.
    ``ledger_dir``: the ledger directory (default: ``$KAHM_DASK_LEDGER_DIR``, else
    ``~/.local/share/kahm-dask/ledgers``), where every entry point finds the data set's ledger.
    """

    _key: ClassVar[str] = "privacy"
    epsilon: float | None = field(default=None, metadata=rule("epsilon"))
    delta: float = field(default=0.0, metadata=rule("delta"))
    d: float | None = field(default=None, metadata=rule("d"))
    dp_data: DpData = "fabricated"
    r_source: RSource = "passes"
    r_value: int | float | None = field(default=None, metadata=rule("r_value"))
    cluster_on: ClusterOn = "noisy"
    max_passes: int = field(default=100, metadata=rule("max_passes"))
    budget: list | None = field(default=None, metadata={"check": lambda v, k: _check_budget(v, k)})
    ledger_dir: Path | None = None

    def _validate(self) -> None:
        if self.ledger_dir is not None:
            object.__setattr__(self, "ledger_dir", Path(self.ledger_dir).expanduser().absolute())
        try:
            r_value = check_r_value(self.r_source, self.r_value, "the privacy section")
        except RuleError as exc:
            raise invalid_value(f"privacy.{exc.name}", exc.reason, exc.value) from None
        object.__setattr__(self, "r_value", r_value)


def _check_budget(value: list, key: str) -> None:
    """``[epsilon, delta]`` within the ranges of ``privacy.epsilon`` and ``privacy.delta``."""
    epsilon, delta = PARAMS["epsilon"].range, PARAMS["delta"].range
    if not (len(value) == 2 and all(_number(v) for v in value) and value[0] in epsilon and value[1] in delta):
        reason = f"expected [epsilon, delta] with epsilon {epsilon.bounds_text()} and delta {delta.bounds_text()}"
        raise invalid_value(key, reason, value)


@dataclass(frozen=True, kw_only=True)
class PartitionConfig(Section):
    """``partition``: dask-ml k-means|| per class (``oversampling_factor: null`` = 2·K);
    a class is held in worker memory during its k-means when its rows take at most
    ``persist_fraction`` of the workers' total memory limit (0: always re-read from Zarr);
    ``max_cluster_rows`` (null: no cap) splits larger clusters, bounding every training
    task's memory (a fabrication task holds about 3 copies of its rows plus a KAHM fit)."""

    _key: ClassVar[str] = "partition"
    oversampling_factor: float | None = field(default=None, metadata=rule("oversampling_factor"))
    init_max_iter: int = field(default=5, metadata=rule("init_max_iter"))
    max_iter: int = field(default=100, metadata=rule("kmeans_max_iter"))
    persist_fraction: float = field(default=0.25, metadata=rule("persist_fraction"))
    max_cluster_rows: int | None = field(default=None, metadata=rule("max_cluster_rows"))


@dataclass(frozen=True, kw_only=True)
class EvaluateConfig(Section):
    """``evaluate``: membership inference on (at most ``max_train_rows``) training rows."""

    _key: ClassVar[str] = "evaluate"
    membership: bool = True
    max_train_rows: int | None = field(default=None, metadata=bound(ge=1))


@dataclass(frozen=True, kw_only=True)
class ReportConfig(Section):
    """``report``: what the run writes besides the metrics."""

    _key: ClassVar[str] = "report"
    plots: bool = True


@dataclass(frozen=True, kw_only=True)
class ClusterConfig(Section):
    """``cluster``: where the work runs (see :func:`kahm_dask.pipeline.cluster.connect`).

    ``scheduler`` (address of a running scheduler) or ``config`` (a ``cluster_configs/``
    file), at most one of them; with neither, a LocalCluster of ``n_workers`` workers.
    ``tls`` (``ca_file``, ``cert``, ``key``, ``require_encryption``;
    :mod:`kahm_dask.pipeline.security`): mutual TLS with a ``tls://`` scheduler, or for the
    LocalCluster; a cluster config file holds its own ``tls``. ``dashboard_address``: the
    LocalCluster's dashboard, on this machine's loopback interface by default (it has no
    authentication); another host warns with ``PrivacyLeakWarning``, null turns it off.
    """

    _key: ClassVar[str] = "cluster"
    scheduler: str | None = field(default=None, metadata=ADDRESS)
    config: Path | None = None
    n_workers: int = field(default=2, metadata=bound(ge=1))
    threads_per_worker: int = field(default=1, metadata=bound(ge=1))
    memory_limit: str = field(default="auto", metadata=MEMORY)
    processes: bool = True
    tls: _security.ClusterTLSConfig | None = None  # resolved lazily: security.py builds on Section
    dashboard_address: str | None = field(default=DASHBOARD, metadata=DASHBOARD_RULE)

    def _validate(self) -> None:
        if self.scheduler is not None and self.config is not None:
            raise ConfigError(
                "conflicting keys 'cluster.scheduler' and 'cluster.config'",
                ": give at most one (an address to connect to, or a cluster config file)",
                key="cluster.scheduler",
            )
        if self.config is not None and not self.config.is_file():
            raise invalid_value("cluster.config", "no such file", str(self.config))
        if self.tls is not None and self.config is not None:
            raise ConfigError(
                "conflicting keys 'cluster.tls' and 'cluster.config'",
                ": a cluster config file holds its own 'tls' (kinds remote and local); "
                "move the TLS settings there",
                key="cluster.tls",
            )
        if self.scheduler is not None:
            _security.check_address(self.scheduler, self.tls is not None,
                                    address_key="cluster.scheduler", tls_key="cluster.tls")


@dataclass(frozen=True, kw_only=True)
class PipelineConfig(Section):
    """A whole pipeline file: ``name``, ``seed`` (seeds the k-means steps only; it is not
    secret: the DP noise always comes from the operating system's secure generator; ``null``,
    the default, draws one at the first run and keeps it in the run's work store so that a
    resumed run repeats it), ``output`` (the run directory: ``public/`` and ``owner/``) and
    the sections."""

    name: str
    seed: int | None = field(default=None, metadata=rule("random_state"))
    output: Path
    data: DataConfig
    model: ModelConfig = field(default_factory=ModelConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    def _validate(self) -> None:
        if not self.name.strip():
            raise invalid_value("name", "must not be empty", self.name)

    @classmethod
    def from_dict(
        cls, d: Any, *, base_dir: str | os.PathLike[str], origin: str | None = None
    ) -> PipelineConfig:
        """Validate the parsed mapping ``d`` of a pipeline file.

        ``base_dir`` is the YAML file's directory, where a relative ``cluster.config`` is
        looked up when it does not exist relative to the working directory. ``origin``
        names the source in error messages (default: "the pipeline config").
        """
        origin = origin or "the pipeline config"
        try:
            return cls.from_mapping(_with_cluster_config_resolved(d, Path(base_dir).absolute()))
        except ConfigError as exc:
            raise exc.located(origin) from None

    def with_overrides(self, **dotted: Any) -> PipelineConfig:
        """A validated copy with dotted keys replaced, e.g. ``{"cluster.scheduler": addr}``.

        Values must already have the schema's types (parse command-line strings with
        ``yaml.safe_load`` first); relative paths are relative to the working directory.
        """
        d = self.to_dict()
        for key, value in dotted.items():
            _set_dotted(d, key, value)
        return type(self).from_dict(d, base_dir=Path.cwd(), origin="the overrides")


def _with_cluster_config_resolved(d: Any, base_dir: Path) -> Any:
    """``d`` with a relative ``cluster.config`` made absolute: cwd first, then ``base_dir``."""
    cluster = d.get("cluster") if isinstance(d, Mapping) else None
    path = cluster.get("config") if isinstance(cluster, Mapping) else None
    if not isinstance(path, str) or not path or os.path.isabs(os.path.expanduser(path)):
        return d
    candidates = [Path.cwd() / path, base_dir / path]
    found = next((c for c in candidates if c.is_file()), None)
    if found is None:
        raise invalid_value(
            "cluster.config",
            f"no such file (looked in {candidates[0]} and {candidates[1]})", path,
        )
    return {**d, "cluster": {**cluster, "config": str(found.absolute())}}


def _set_dotted(d: dict[str, Any], key: str, value: Any) -> None:
    """Set ``d[a][b][c] = value`` for ``key = "a.b.c"``, creating missing sections."""
    *parents, last = key.split(".")
    node = d
    for depth, name in enumerate(parents):
        child = node.get(name)
        if child is None:
            child = node[name] = {}
        if not isinstance(child, dict):
            section = ".".join(parents[: depth + 1])
            raise ConfigError(
                f"cannot override '{key}'", f": '{section}' is a value, not a section",
                key=key, origin="the overrides",
            )
        node = child
    node[last] = value


# --------------------------------------------------------------------------- YAML


class _StrictLoader(yaml.SafeLoader):
    """Safe loader with YAML 1.2 numbers and an error on duplicate keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"found duplicate key {key!r}", key_node.start_mark,
                )
            if isinstance(key, Hashable):
                seen.add(key)
        return super().construct_mapping(node, deep)


_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_INT, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_StrictLoader.add_implicit_resolver(
    _INT,
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)
_StrictLoader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def load_yaml(path: str | os.PathLike[str]) -> Any:
    """Parse a YAML file with the strict loader; syntax errors become ConfigError."""
    with open(path, encoding="utf-8") as fh:
        try:
            return yaml.load(fh, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
        except yaml.YAMLError as exc:
            raise ConfigError(f"cannot parse {os.fspath(path)}", f": {exc}") from None


def load_config(path: str | os.PathLike[str]) -> PipelineConfig:
    """Load and validate a pipeline YAML file (see the module docstring for paths)."""
    return PipelineConfig.from_dict(
        load_yaml(path), base_dir=Path(path).absolute().parent, origin=os.fspath(path)
    )


# The TLS section (security.py) builds on Section above: imported last, as a module, so that
# either module can be imported first; ClusterConfig's ``tls`` hint is resolved at first use.
from kahm_dask.pipeline import security as _security  # noqa: E402
