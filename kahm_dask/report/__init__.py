"""The quality report of a DP release: scores of the DP rows against the private rows
(:mod:`~kahm_dask.report.metrics`), pictures (:mod:`~kahm_dask.report.pictures`) and the HTML
file (:func:`write_quality_report`)."""

from kahm_dask.report.html import write_quality_report

__all__ = ["write_quality_report"]
