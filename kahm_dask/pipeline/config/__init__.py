"""The configuration files: pipeline files (:mod:`~kahm_dask.pipeline.config.sections`) and
cluster config files (:mod:`~kahm_dask.pipeline.config.cluster_files`), on one schema engine
(:mod:`~kahm_dask.pipeline.config.schema`). The public names are re-exported here."""

from kahm_dask.pipeline.config.schema import (
    ADDRESS,
    DASHBOARD,
    DASHBOARD_RULE,
    MEMORY,
    ConfigError,
    Section,
    bound,
    dashboard_is_local,
    invalid_value,
    load_yaml,
    rule,
    set_dotted,
    within,
)
from kahm_dask.pipeline.config.sections import (
    SKLEARN_PREFIX,
    SYNTHETIC_SOURCE,
    ClusterConfig,
    ClusterTLSConfig,
    DataConfig,
    EvaluateConfig,
    FederatedPipelineConfig,
    FederationConfig,
    ModelConfig,
    PartitionConfig,
    PipelineConfig,
    PrivacyConfig,
    ReportConfig,
    SyntheticConfig,
    TLSConfig,
    load_config,
    load_federated_config,
)

__all__ = [
    "ADDRESS", "DASHBOARD", "DASHBOARD_RULE", "MEMORY", "ConfigError", "Section", "bound", "dashboard_is_local",
    "invalid_value", "load_yaml", "rule", "set_dotted", "within", "SKLEARN_PREFIX", "SYNTHETIC_SOURCE",
    "ClusterConfig", "ClusterTLSConfig", "DataConfig", "EvaluateConfig", "FederatedPipelineConfig",
    "FederationConfig", "ModelConfig", "PartitionConfig", "PipelineConfig", "PrivacyConfig", "ReportConfig",
    "SyntheticConfig", "TLSConfig", "load_config", "load_federated_config",
]
