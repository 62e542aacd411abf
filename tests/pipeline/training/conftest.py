"""The two routes of a training run's stages 2–4 (kahm_dask/pipeline/training/in_memory.py):
``memory``, which small test data take by default, and ``zarr``, the work store's copies that
data larger than the workers' memory take; the ``route`` fixture runs a test on each."""

from __future__ import annotations

import pytest

from kahm_dask.pipeline.training import train as train_mod

ROUTES = ("memory", "zarr")

#: The summary's ``rows_held`` on each route.
HELD = {"memory": "worker memory", "zarr": "work store copies"}


@pytest.fixture(params=ROUTES)
def route(request, monkeypatch) -> str:
    """``memory`` or ``zarr``; on ``zarr`` the run is told the rows do not fit in memory."""
    if request.param == "zarr":
        monkeypatch.setattr(train_mod, "fits_in_memory", lambda *args, **kwargs: False)
    return request.param
