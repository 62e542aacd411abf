"""The user's script of ``bench_user_path``, run as a file: ``python benchmarks/_user_script.py ROWS.npz``.

It is the snippet of that benchmark as a user writes it in a script, imports at the top and the
work under ``if __name__ == "__main__":``. Dask starts its worker processes with
multiprocessing's ``spawn``, which runs the top of the main script again in every worker, so
these workers import ``kahm_dask`` (and scikit-learn, SciPy, Zarr) while ``Client(...)`` starts,
not in the first fit; the start of the client is timed too. It takes the timed snippet from
``_user_snippet.py`` in its own folder and nothing else from this tree: whichever ``kahm_dask``
is first on ``PYTHONPATH`` is the code measured, in the client and in the workers. ``ROWS.npz``
holds ``Xtr, ytr, Xte, yte``. Prints one line of JSON.
"""

import json
import sys

# the user's imports, at the top: the spawned workers run them too
import dask.array as da  # noqa: F401
import numpy as np
from _user_snippet import timed_snippet  # this file's folder, first on the path
from distributed import Client  # noqa: F401

from kahm_dask import DaskKAHMClassifier, KAHMClassifier  # noqa: F401


def main(rows_path: str) -> dict:
    """The snippet on the rows of ``rows_path`` (:func:`_user_snippet.timed_snippet`)."""
    rows = np.load(rows_path)
    return timed_snippet(rows["Xtr"], rows["ytr"], rows["Xte"], rows["yte"])


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])), flush=True)
