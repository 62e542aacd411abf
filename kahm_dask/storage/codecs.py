"""The codec of every array of rows or weights the library writes (zstd at level 1) and the
chunks of the model store's arrays (whole rows up to 8 MiB).

A model's arrays are float64 solutions of linear systems (β = (K + λI)⁻¹[Y | 1]) and
projections (the PCA codes and components). Whether they compress depends on the rows:
on MNIST a cluster's β shrinks 1.77×, because a pixel that is zero in every row of a
cluster gives a zero column of Y and so of β (325 of 785 columns); on Gaussian rows it
shrinks 4 %. Zarr's default, zstd at level 0 (which zstd reads as its default level, 3), gets
no more out of them than level 1 and writes slower (one core, the median of 5–7 writes of
one β; the ratio is the compression's):

==============================  =================  ==================
β                               zstd level 3       zstd level 1
==============================  =================  ==================
MNIST cluster, 1082 × 785       46.6 ms, 1.77×     33.5 ms, 1.77×
Gaussian, 975 × 4097            84.1 ms, 1.04×     69.1 ms, 1.04×
==============================  =================  ==================

Reads take the same time at either level. Every training task writes one model, so the model
store uses level 1 (:data:`ARRAY_CODECS`).

A faster codec was measured against it on whole cluster models (``python -m
benchmarks.bench_model_codecs``: the median of 9 writes of one fitted model through
:func:`~kahm_dask.pipeline.stores.model.save_cluster`, one read; load average 2.4–2.7, a
shared machine):

==================================  ======================  ======================
model                               zstd level 1            Blosc LZ4 level 1
==================================  ======================  ======================
MNIST, 1000 × 784 float64           45.4 ms, 4.76 MiB       36.5 ms, 5.12 MiB
4096 features, 1000 × 4096 float32  54.1 ms, 15.27 MiB      41.7 ms, 16.45 MiB
==================================  ======================  ======================

LZ4 saves 9 ms per MNIST cluster (about 0.3 s of the 60-cluster fit's wall time on 2 workers)
for 8 % more bytes in every model store, the 4 GiB run's among them: zstd stays.

Rows (the data store, the noisy release, the work store's copies, a model's DP rows) use level 1
too (the same :data:`ARRAY_CODECS`). The noisy rows are why: the discrete Laplace mechanism puts them on a
grid, where level 3 searches for long matches slowly. One process, one 2048 × 4096 float32 chunk
(32 MiB), ``python -m benchmarks.bench_codecs`` (write and read rate, compression ratio):

==========================================  ======================  ======================
rows                                        zstd level 3            zstd level 1
==========================================  ======================  ======================
(0, 1) features, like the 4 GiB run's       356, 627 MB/s, 1.13×    366, 577 MB/s, 1.13×
the same, released at ε = 2 per entry       89, 397 MB/s, 1.90×     142, 456 MB/s, 1.73×
==========================================  ======================  ======================

On the 4 GiB DP run, while they were written at level 3, each copy of the noisy rows took twice
as long as the same copy of the private rows. A reader needs no setting, since a Zarr array
records its codecs and chunks.

A model array is always read whole, so its chunks are whole rows, as many as fit in
:data:`MODEL_CHUNK_BYTES` (:func:`model_chunks`): an MNIST cluster's β (about 1000 × 785) is one
chunk, one file and one compressor call, where Zarr's default (chunks near 1 MiB) cut it into 16.
The cap bounds what one chunk costs to decode beside the array (a 2000 × 4097 β is 8 chunks).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from zarr.codecs import ZstdCodec

__all__ = ["ARRAY_CODECS", "MODEL_CHUNK_BYTES", "model_chunks"]

#: ``zarr.create_array`` (and ``dask.array.to_zarr``) keywords for every array of rows or
#: model weights the library writes.
ARRAY_CODECS: dict[str, Any] = {"compressors": ZstdCodec(level=1)}

#: The largest chunk of a model array, in uncompressed bytes (unless one row is larger).
MODEL_CHUNK_BYTES = 8 * 2**20


def model_chunks(arr: np.ndarray) -> tuple[int, ...]:
    """The chunk shape of the model array ``arr``: whole rows, at most :data:`MODEL_CHUNK_BYTES`
    of them (at least one row; a 0-d or empty array is one chunk of its shape, at least 1).

    >>> model_chunks(np.zeros((1000, 785)))
    (1000, 785)
    >>> model_chunks(np.zeros((2000, 4097)))
    (255, 4097)
    """
    if arr.ndim == 0:
        return ()
    row_bytes = max(arr[:1].nbytes, arr.itemsize)
    rows = max(1, min(arr.shape[0], MODEL_CHUNK_BYTES // row_bytes))
    return (rows, *(max(1, n) for n in arr.shape[1:]))
