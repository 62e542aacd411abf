"""The state an interrupted training run leaves: its model staged in the work store."""

from __future__ import annotations

import shutil
from pathlib import Path

from kahm_dask.pipeline.stores.model import cluster_dir
from kahm_dask.pipeline.training import STAGED_MODEL


def interrupt_after_training(model: Path, work: Path, *lost: tuple[int, int]) -> Path:
    """Move the finished model store ``model`` back to where a run interrupted before its commit
    leaves it: staged in ``work``, without its completion marker and without the clusters
    ``lost``. Returns the staged store."""
    staged = Path(work) / STAGED_MODEL
    Path(model).rename(staged)
    (staged / "_COMPLETE.json").unlink()
    for c, s in lost:
        shutil.rmtree(cluster_dir(staged, c, s))
    return staged
