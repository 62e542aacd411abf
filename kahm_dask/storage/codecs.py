"""The codec of the model store's arrays: zstd at level 1.

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
store uses level 1 (:data:`MODEL_ARRAYS`). Rows (the data store, the work store's copies, the
DP rows) keep Zarr's default codec. A reader needs no setting, since a Zarr array records its
codecs.
"""

from __future__ import annotations

from typing import Any

from zarr.codecs import ZstdCodec

__all__ = ["MODEL_ARRAYS"]

#: ``zarr.create_array`` keywords for a model array.
MODEL_ARRAYS: dict[str, Any] = {"compressors": ZstdCodec(level=1)}
