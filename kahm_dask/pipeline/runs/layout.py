"""The folders of a run: every path a run (central or federated) writes, named once.

A run's folder is split at the release boundary (:class:`RunPaths`)::

    <output>/public/                 DP runs only; may be published:
        model.zarr                   the model store (DP rows and models fitted on them)
        PRIVACY.md                   the privacy statement and the ledger's total
        dp_rows.png                  a plot of DP rows (noisy or fabricated)
    <output>/owner/                  0700: stays with the data owner
        data/train.zarr, test.zarr   the private stores (and their privacy ledger)
        work/                        private copies, the noisy rows, the model while it is trained
        model.zarr                   a non-private run's model store (fitted on private rows)
        predictions.zarr             the predictions of the test store
        report.json, report.md       everything computed on private rows: accuracy, membership
        distances.png                metrics, distances, timings

A federated run (:class:`FederationPaths`) has the coordinator's folders (a non-private
:class:`RunPaths` at ``<output>``, plus ``owner/sites.json``, the split) and one
:class:`RunPaths` per site at ``<output>/sites/site{q}/``, beside which
``answers/<name>.zarr`` holds the site's answers to the queries ``name`` and
``owner/membership.json`` its membership report.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kahm_dask.pipeline.training.work import STAGED_MODEL
from kahm_dask.storage.private import private_directory

__all__ = ["PUBLIC", "OWNER", "REPORT_JSON", "REPORT_MD", "DISTANCES_PLOT", "DP_ROWS_PLOT", "STATEMENT_FILE",
           "RunPaths", "run_paths", "FederationPaths"]

PUBLIC, OWNER = "public", "owner"
REPORT_JSON, REPORT_MD, DISTANCES_PLOT = "report.json", "report.md", "distances.png"
STATEMENT_FILE, DP_ROWS_PLOT = "PRIVACY.md", "dp_rows.png"


@dataclass(frozen=True)
class RunPaths:
    """The folders of one run (or of one site of a federated run) at ``root``; ``private`` = a
    DP run (module docstring)."""

    root: Path
    private: bool

    @property
    def public(self) -> Path:
        return self.root / PUBLIC

    @property
    def owner(self) -> Path:
        return self.root / OWNER

    @property
    def model(self) -> Path:
        return (self.public if self.private else self.owner) / "model.zarr"

    @property
    def statement(self) -> Path:
        return self.public / STATEMENT_FILE

    @property
    def data(self) -> Path:
        return self.owner / "data"

    @property
    def train_store(self) -> Path:
        return self.data / "train.zarr"

    @property
    def test_store(self) -> Path:
        return self.data / "test.zarr"

    @property
    def work(self) -> Path:
        return self.owner / "work"

    @property
    def staged_model(self) -> Path:
        """The model while it is trained (in the work store; moved to :attr:`model` when done)."""
        return self.work / STAGED_MODEL

    @property
    def predictions(self) -> Path:
        return self.owner / "predictions.zarr"

    @property
    def report_md(self) -> Path:
        return self.owner / REPORT_MD

    def make_dirs(self) -> None:
        """Create ``owner/`` (0700: private by file mode) and, for a DP run, ``public/``."""
        private_directory(self.owner)
        if self.private:
            self.public.mkdir(parents=True, exist_ok=True)


def run_paths(output: str | Path, private: bool) -> RunPaths:
    """The folders of a run (or of one site of a federated run) under ``output``."""
    return RunPaths(Path(output), bool(private))


@dataclass(frozen=True)
class FederationPaths:
    """The folders of a federated run at ``root`` (module docstring); ``private`` = DP sites."""

    root: Path
    private: bool

    @property
    def coordinator(self) -> RunPaths:
        """The coordinator's folders: nothing of it is published (its ``owner/`` holds the pooled
        input of the simulation, the split, the global predictions and the report)."""
        return RunPaths(self.root, False)

    @property
    def split_record(self) -> Path:
        return self.coordinator.owner / "sites.json"

    @property
    def sites_dir(self) -> Path:
        return self.root / "sites"

    def site(self, q: int) -> RunPaths:
        return RunPaths(self.sites_dir / f"site{q}", self.private)

    def answers(self, q: int, name: str) -> Path:
        """Site q's answers to the queries ``name``, beside its ``public/`` and ``owner/``."""
        return self.site(q).root / "answers" / f"{name}.zarr"

    def membership(self, q: int) -> Path:
        return self.site(q).owner / "membership.json"

    def private_folders(self) -> list[Path]:
        """Every folder of the run that holds private rows or what is computed from them."""
        folders = [self.coordinator.owner]
        for site in sorted(self.sites_dir.glob("site*")):
            folders += [site / OWNER, site / "answers"]
        return folders
