"""The sections of a pipeline file (``pipelines/*.yaml``): ``data``, ``model``, ``privacy``,
``partition``, ``evaluate``, ``report`` and ``cluster`` (with its ``tls``) beside the top-level
keys ``name``, ``seed`` and ``output``, and the ``federation`` of a federated run. Each is one
frozen dataclass on :class:`~kahm_dask.pipeline.config.schema.Section`; the ranges and choices of
the model and privacy parameters, and the rule tying ``privacy.r_value`` to
``privacy.r_source``, are those of :mod:`kahm_dask.params` (shared with the estimators and the CLI).

**Relative paths** (``output``, file paths in ``data.source`` and ``data.test_source``,
``cluster.config``, the ``tls`` files, ``privacy.ledger_dir``) are resolved against the *current
working directory* when the config is loaded, and stored absolute. One exception:
``cluster.config`` is looked up relative to the YAML file's directory if it does not exist
relative to the working directory, so a pipeline file can name a cluster config next to it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from kahm_dask.params import PARAMS, RuleError, check_privacy_target, check_r_value
from kahm_dask.pipeline.config.schema import (
    ADDRESS,
    DASHBOARD,
    DASHBOARD_RULE,
    MEMORY,
    ConfigError,
    Section,
    bound,
    invalid_value,
    load_yaml,
    param,
    set_dotted,
)

__all__ = [
    "TLS_PROTOCOL",
    "ALL_ROLES",
    "SYNTHETIC_SOURCE",
    "SKLEARN_PREFIX",
    "TLSConfig",
    "ClusterTLSConfig",
    "check_address",
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
    "estimator_params",
    "FederationConfig",
    "FederatedPipelineConfig",
    "load_federated_config",
]

SYNTHETIC_SOURCE = "synthetic:blobs"
SKLEARN_PREFIX = "sklearn:"

Scale = Literal["minmax", "none", "tanh255"]
Dtype = Literal["float32", "float64"]
SyntheticGenerator = Literal["blobs", "directions"]
# the choices of the model and privacy parameters (kahm_dask/params.py)
SRule = Literal[PARAMS["s_rule"].choices]
DpData = Literal[PARAMS["dp_data"].choices]
RSource = Literal[PARAMS["r_source"].choices]
ClusterOn = Literal[PARAMS["cluster_on"].choices]
EvalDtype = Literal[PARAMS["eval_dtype"].choices]


# --------------------------------------------------------------------------- tls

TLS_PROTOCOL = "tls://"
#: The roles of a cluster kahm-dask starts itself: it is the client, the scheduler and the workers.
ALL_ROLES = ("client", "scheduler", "worker")


def _no_password() -> bytes:
    """The password callback of the check: an encrypted key fails instead of prompting."""
    return b""


@dataclass(frozen=True, kw_only=True)
class TLSConfig(Section):
    """``tls``: the certificate authority, this side's certificate and key (PEM files).

    ``key`` may be None when the ``cert`` file holds the private key too. ``require_encryption``
    refuses any unencrypted connection (keep it true). See the module docstring.
    """

    _key: ClassVar[str] = "tls"
    ca_file: Path
    cert: Path
    key: Path | None = None
    require_encryption: bool = True

    def _validate(self) -> None:
        for name in ("ca_file", "cert", "key"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise invalid_value(self._name(name), "no such file", str(path))
        self._check_loads()

    def _name(self, field_name: str) -> str:
        return f"{self._key}.{field_name}"

    def _check_loads(self) -> None:
        """Load the files as Dask will (a certificate chain, then the CA), naming the key at fault."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        try:
            context.load_cert_chain(self.cert, self.key, password=_no_password)
        except (ssl.SSLError, OSError) as exc:
            which = "cert" if self.key is None else "key"
            reason = (f"the certificate and its private key do not load ({exc.__class__.__name__}: {exc}); "
                      "give PEM files, the key unencrypted and matching the certificate")
            if self.key is None:
                reason += f", and '{self._name('key')}' unless '{self._name('cert')}' holds the key"
            raise invalid_value(self._name(which), reason, str(getattr(self, which))) from None
        try:
            context.load_verify_locations(cafile=self.ca_file)
        except (ssl.SSLError, OSError) as exc:
            raise invalid_value(self._name("ca_file"), f"not a PEM CA certificate ({exc})",
                                str(self.ca_file)) from None


@dataclass(frozen=True, kw_only=True)
class ClusterTLSConfig(TLSConfig):
    """``cluster.tls`` of a pipeline file (the same keys as :class:`TLSConfig`)."""

    _key: ClassVar[str] = "cluster.tls"


def check_address(address: str, has_tls: bool, *, address_key: str, tls_key: str) -> None:
    """Raise :class:`~kahm_dask.pipeline.config.ConfigError` unless the scheduler ``address``
    and the presence of TLS settings agree: ``tls://`` needs them, any other protocol refuses
    them. ``address_key`` and ``tls_key`` name the two settings in the message."""
    is_tls = address.startswith(TLS_PROTOCOL)
    if is_tls and not has_tls:
        raise ConfigError(
            f"missing '{tls_key}' for the tls:// address '{address_key}'",
            f": {address!r} needs TLS settings (ca_file, cert and key) to prove this client to the "
            f"scheduler; give '{tls_key}', or the scheduler's tcp:// address if it does not use TLS",
            key=tls_key,
        )
    if has_tls and not is_tls:
        raise ConfigError(
            f"'{tls_key}' is given but '{address_key}' is not a tls:// address",
            f": {address!r} would be neither encrypted nor authenticated, whatever '{tls_key}' says; "
            f"use the scheduler's tls:// address (tls://host:port), or remove '{tls_key}'",
            key=address_key,
        )



# --------------------------------------------------------------------------- the pipeline


@dataclass(frozen=True, kw_only=True)
class SyntheticConfig(Section):
    """``data.synthetic``: generated classes, only for ``data.source: synthetic:blobs``.

    ``generator``: ``blobs`` (:func:`~kahm_dask.pipeline.stores.synthetic.synthetic_blobs`,
    Gaussian blobs whose classes differ by a few thousandths per feature) or ``directions``
    (:func:`~kahm_dask.pipeline.stores.synthetic.synthetic_directions`: classes that differ along
    ``n_directions`` directions with ``amplitude`` per feature, learnable from DP rows at scale).
    ``n_directions`` and ``amplitude`` are used by ``directions`` only.
    """

    _key: ClassVar[str] = "data.synthetic"
    n_samples: int = field(default=100_000, metadata=bound(ge=1))
    n_features: int = field(default=64, metadata=bound(ge=1))
    n_classes: int = field(default=10, metadata=bound(ge=2))
    dtype: Dtype = "float64"
    generator: SyntheticGenerator = "blobs"
    n_directions: int = field(default=16, metadata=bound(ge=1))
    amplitude: float = field(default=1.0, metadata=bound(ge=0))

    def _validate(self) -> None:
        if self.n_samples < self.n_classes:
            raise invalid_value(
                "data.synthetic.n_samples", f"must be >= n_classes ({self.n_classes})", self.n_samples
            )
        if self.generator == "directions" and self.n_directions > self.n_features:
            raise invalid_value(
                "data.synthetic.n_directions", f"must be <= n_features ({self.n_features})", self.n_directions
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
    private min/max). See :func:`kahm_dask.pipeline.runs.data.feature_bounds`.
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


def number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_bounds(value: list, key: str) -> None:
    """``[lower, upper]``: each a finite number or a non-empty list of finite numbers; lists of
    both sides have the same length, and upper > lower everywhere."""
    reason = "expected [lower, upper], each a number or a list of one number per feature"
    if len(value) != 2:
        raise invalid_value(key, reason, value)
    sides = []
    for side in value:
        if number(side):
            sides.append([float(side)])
        elif isinstance(side, (list, tuple)) and side and all(number(v) for v in side):
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
    """``model``: the DeepKAHM of each cluster (``min_range``: the code range below which a
    direction is dropped), the partition into clusters (``n_init``, ``kmeans_dims``: the k-means
    of a class partitioned in one task), the routing of predictions (``n_probe``: clusters per
    class a query meets; null: all), their precision (``eval_dtype``: float64 or float32 kernel
    blocks, docs/algorithm.md#evaluation-precision; "auto", the default, is float64 for the run's
    stored distances and the estimator's certified float32 ``predict``,
    docs/algorithm.md#certified-prediction) and their blocks (``chunk_size``: rows per block of
    an evaluation, memory only)."""

    _key: ClassVar[str] = "model"
    n_components: int = param("n_components")
    n_layers: int = param("n_layers")
    block_size: int = param("block_size")
    s_rule: SRule = param("s_rule")
    min_cluster_size: int | None = param("min_cluster_size")
    n_init: int = param("n_init")
    kmeans_dims: int | None = param("kmeans_dims")
    n_probe: int | None = param("n_probe")
    eval_dtype: EvalDtype = param("eval_dtype")
    min_range: float | None = param("min_range")
    chunk_size: int = param("chunk_size")


@dataclass(frozen=True, kw_only=True)
class PrivacyConfig(Section):
    """``privacy``: element-level DP noise and fabrication; ``epsilon: null`` = non-private.

    A missing ``privacy`` block or ``privacy: null`` gives these defaults (non-private).
    ``record_epsilon`` (at ``record_delta``, default 1e-5) in place of ``epsilon`` sets the ε of a
    whole record; the ε per entry is solved from it and the data's number of features (at most
    one of the two). ``delta`` 0 (the default) is pure ε-DP. ``d`` (the largest change of one entry that is
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
    ``~/.local/share/kahm-dask/ledgers``), where every entry point charges its releases to their rows.
    """

    _key: ClassVar[str] = "privacy"
    epsilon: float | None = param("epsilon")
    record_epsilon: float | None = param("record_epsilon")
    record_delta: float = param("record_delta")
    delta: float = param("delta")
    d: float | None = param("d")
    dp_data: DpData = param("dp_data")
    r_source: RSource = param("r_source")
    r_value: int | float | None = param("r_value")
    cluster_on: ClusterOn = param("cluster_on")
    max_passes: int = param("max_passes")
    budget: list | None = field(default=None, metadata={"check": lambda v, k: _check_budget(v, k), "param": "budget"})
    ledger_dir: Path | None = None

    def _validate(self) -> None:
        if self.ledger_dir is not None:
            object.__setattr__(self, "ledger_dir", Path(self.ledger_dir).expanduser().absolute())
        try:
            check_privacy_target(self.epsilon, self.record_epsilon, "the privacy section")
            r_value = check_r_value(self.r_source, self.r_value, "the privacy section")
        except RuleError as exc:
            raise invalid_value(f"privacy.{exc.name}", exc.reason, exc.value) from None
        object.__setattr__(self, "r_value", r_value)

    @property
    def private(self) -> bool:
        """True for a DP run: ``epsilon`` (per entry) or ``record_epsilon`` (per record) set."""
        return self.epsilon is not None or self.record_epsilon is not None


def _check_budget(value: list, key: str) -> None:
    """``[epsilon, delta]`` within the ranges of ``privacy.epsilon`` and ``privacy.delta``."""
    epsilon, delta = PARAMS["epsilon"].range, PARAMS["delta"].range
    if not (len(value) == 2 and all(number(v) for v in value) and value[0] in epsilon and value[1] in delta):
        reason = f"expected [epsilon, delta] with epsilon {epsilon.bounds_text()} and delta {delta.bounds_text()}"
        raise invalid_value(key, reason, value)


@dataclass(frozen=True, kw_only=True)
class PartitionConfig(Section):
    """``partition``: dask-ml k-means|| per class (``oversampling_factor: null`` = 2·K);
    a class is held in worker memory during its k-means when its rows take at most
    ``persist_fraction`` of the workers' total memory limit, and all rows are partitioned in
    worker memory, without the work store's reordered copies, when they take at most that share
    and every class fits one task (0: always through Zarr);
    ``max_cluster_rows`` (null: no cap) splits larger clusters, bounding every training
    task's memory (a fabrication task holds about 3 copies of its rows plus a KAHM fit)."""

    _key: ClassVar[str] = "partition"
    oversampling_factor: float | None = param("oversampling_factor")
    init_max_iter: int = param("init_max_iter")
    max_iter: int = param("kmeans_max_iter")
    persist_fraction: float = param("persist_fraction")
    max_cluster_rows: int | None = param("max_cluster_rows")


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
    :mod:`kahm_dask.pipeline.cluster.security`): mutual TLS with a ``tls://`` scheduler, or for the
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
    tls: ClusterTLSConfig | None = None
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
            check_address(self.scheduler, self.tls is not None,
                                    address_key="cluster.scheduler", tls_key="cluster.tls")


@dataclass(frozen=True, kw_only=True)
class PipelineConfig(Section):
    """A whole pipeline file: ``name``, ``seed`` (seeds the k-means steps only; it is not
    secret: the DP noise always comes from the operating system's secure generator; ``null``,
    the default, draws one at the first run and keeps it in the run's work store so that a
    resumed run repeats it), ``output`` (the run directory: ``public/`` and ``owner/``) and
    the sections."""

    name: str
    seed: int | None = param("random_state")
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
            set_dotted(d, key, value)
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


def load_config(path: str | os.PathLike[str]) -> PipelineConfig:
    """Load and validate a pipeline YAML file (see the module docstring for paths)."""
    return PipelineConfig.from_dict(
        load_yaml(path), base_dir=Path(path).absolute().parent, origin=os.fspath(path)
    )


# The TLS section (security.py) builds on Section above: imported last, as a module, so that
# either module can be imported first; ClusterConfig's ``tls`` hint is resolved at first use.


# --------------------------------------------------------------------------- federation

SplitScheme = Literal["iid", "per_class", "label_skew", "dirichlet"]


@dataclass(frozen=True, kw_only=True)
class FederationConfig(Section):
    """``federation``: how the training rows are split into sites.

    ``classes_per_site`` goes with ``split: label_skew`` and ``alpha`` with ``dirichlet``
    (both null otherwise); ``split_seed`` seeds the split; ``pin_sites`` runs site q's tasks
    only on workers with the resource ``site{q}``.
    """

    _key: ClassVar[str] = "federation"
    sites: int = field(metadata=bound(ge=1))
    split: SplitScheme = "iid"
    classes_per_site: int | None = field(default=None, metadata=bound(ge=1))
    alpha: float | None = field(default=None, metadata=bound(gt=0))
    split_seed: int = field(default=0, metadata=bound(ge=0))
    pin_sites: bool = False

    def _validate(self) -> None:
        for name, owner in (("classes_per_site", "label_skew"), ("alpha", "dirichlet")):
            value, key = getattr(self, name), f"federation.{name}"
            if self.split == owner and value is None:
                raise invalid_value(key, f"split '{owner}' needs it", value)
            if self.split != owner and value is not None:
                reason = f"only used with split '{owner}' (split is '{self.split}')"
                raise invalid_value(key, reason, value)


@dataclass(frozen=True, kw_only=True)
class FederatedPipelineConfig(PipelineConfig):
    """A pipeline file with a ``federation`` section; every other key as in
    :class:`~kahm_dask.pipeline.config.PipelineConfig` (same strict validation)."""

    federation: FederationConfig

    def with_overrides(self, **dotted: Any) -> FederatedPipelineConfig:
        """A validated copy with dotted keys replaced (see ``PipelineConfig.with_overrides``)."""
        d = self.to_dict()
        for key, value in dotted.items():
            set_dotted(d, key, value)
        return FederatedPipelineConfig.from_dict(d, base_dir=Path.cwd(), origin="the overrides")


def load_federated_config(path: str | Path) -> FederatedPipelineConfig:
    """Load and strictly validate a federated pipeline YAML file (``pipelines/federated_*``)."""
    return FederatedPipelineConfig.from_dict(
        load_yaml(path), base_dir=Path(path).absolute().parent, origin=str(path)
    )


# --------------------------------------------------------------------------- the estimator's parameters


def estimator_params(cfg: PipelineConfig) -> dict[str, Any]:
    """The estimator parameters a pipeline file sets: every field of its ``model``, ``privacy``
    and ``partition`` sections and its ``seed`` that declares a parameter (:func:`param`; the field
    names the parameter where the YAML key differs, e.g. ``partition.max_iter`` is
    ``kmeans_max_iter``), and the ledger of ``privacy.ledger_dir``. The one translation of a pipeline
    file into parameters (``kahm-dask run`` and the federated run)."""
    ledger = "auto" if cfg.privacy.ledger_dir is None else str(cfg.privacy.ledger_dir)
    params = {"random_state": cfg.seed, "ledger": ledger}
    for section in (cfg.model, cfg.privacy, cfg.partition):
        for f in dataclasses.fields(section):
            if "param" in f.metadata:
                params[f.metadata["param"]] = getattr(section, f.name)
    return params
