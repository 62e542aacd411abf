"""Training on the cluster: the run's settings (:mod:`.settings`), the DP release stage
(:mod:`.release`), the reordered copies (:mod:`.layout`), the k-means partition
(:mod:`.partition`), the per-cluster task (:mod:`.tasks`), the work store (:mod:`.work`) and the
graph that runs them (:mod:`.train`). The public names are re-exported here."""

from kahm_dask.pipeline.training.release import StoredNoiseError, noisy_array, release_bounds
from kahm_dask.pipeline.training.settings import TrainSettings
from kahm_dask.pipeline.training.train import TrainingRows, rows_held_in_memory, train_pipeline, trained_on
from kahm_dask.pipeline.training.work import NOISY, SEED_FILE, STAGED_MODEL, check_training_targets

__all__ = [
    "TrainSettings",
    "train_pipeline",
    "rows_held_in_memory",
    "trained_on",
    "TrainingRows",
    "StoredNoiseError",
    "noisy_array",
    "release_bounds",
    "check_training_targets",
    "NOISY",
    "SEED_FILE",
    "STAGED_MODEL",
]
