"""``python -m kahm_dask.cli``: the ``kahm-dask`` command."""

from kahm_dask.cli import main

main()
