"""The layers hold: importing the core and the privacy layer loads neither Dask, Zarr, fsspec nor
the pipeline, and so do the tests of those layers (tests/core, tests/privacy, tests/storage test
them alone; the pipeline's cases are in tests/pipeline)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests._kit import REPO

CORE = ["kahm_dask", "kahm_dask.classifier", "kahm_dask.federated", "kahm_dask.datasets", "kahm_dask.privacy",
        "kahm_dask.privacy.ledger", "kahm_dask.privacy.release", "kahm_dask.privacy.fingerprint",
        "kahm_dask.privacy.membership", "kahm_dask.privacy.fabrication", "kahm_dask.recipe", "kahm_dask.params",
        "kahm_dask.report"]
FORBIDDEN = ("dask", "distributed", "dask_ml", "zarr", "fsspec", "kahm_dask.pipeline", "kahm_dask.cli")


def test_the_core_and_privacy_layers_import_no_pipeline_and_no_dask():
    assert _loaded_by(CORE) == []


def _loaded_by(modules: list[str]) -> list[str]:
    """The forbidden modules that importing ``modules`` in a fresh interpreter loads."""
    code = (f"import importlib, json, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
            "print(json.dumps(sorted(sys.modules)))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                       timeout=120, cwd=REPO).stdout)
    return [m for m in loaded if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]


def test_the_tests_of_the_core_privacy_and_storage_layers_import_no_pipeline():
    folders = ("core", "privacy", "storage")
    modules = ["tests.conftest"] + [f"tests.{f}.{p.stem}" for f in folders
                                    for p in sorted((REPO / "tests" / f).glob("test_*.py"))]
    assert len(modules) > 20
    assert _loaded_by(modules) == []


def test_the_pipelines_store_functions_are_importable_from_the_package_lazily():
    code = ("import sys, kahm_dask\nassert 'zarr' not in sys.modules\n"
            "from kahm_dask import write_dataset, open_dataset, DaskKAHMClassifier\n"
            "import kahm_dask.pipeline.stores.dataset as s\n"
            "assert write_dataset is s.write_dataset and 'zarr' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_version_is_the_installed_distributions():
    from importlib.metadata import version

    from kahm_dask._version import __version__

    assert __version__ == version("kahm-dask")


def test_the_core_imports_no_dask_until_the_estimator_is_used():
    code = ("import sys, kahm_dask; assert 'dask' not in sys.modules; "
            "kahm_dask.DaskKAHMClassifier; assert 'distributed' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
