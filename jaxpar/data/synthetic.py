"""Synthetic data for pure throughput runs (as tf_cnn_benchmarks' synthetic mode).

A small pool of random images and labels is generated once and indexed modulo
its size, so reading a batch costs one gather and the host stays out of the way.
"""

from __future__ import annotations

import numpy as np

from jaxpar.data.base import DataError

POOL_SIZE = 256
_SEED = 1234  # Fixed: the content is meaningless, only its shape matters.


class PooledSource:
    """`num` random examples backed by a pool of at most POOL_SIZE distinct ones."""

    def __init__(
        self,
        num: int,
        image_shape: tuple[int, int, int],
        num_classes: int,
        split_id: int,
    ):
        if num < 0 or num_classes < 1 or len(image_shape) != 3 or min(image_shape) < 1:
            raise DataError(
                f"synthetic data needs num >= 0, num_classes >= 1 and image_shape (H, W, C); "
                f"got num={num}, num_classes={num_classes}, image_shape={image_shape}"
            )
        rng = np.random.default_rng([_SEED, split_id])
        pool = max(1, min(num, POOL_SIZE))
        self._num = num
        self._images = rng.integers(0, 256, (pool, *image_shape), dtype=np.uint8)
        self._labels = rng.integers(0, num_classes, pool).astype(np.int32)

    def __len__(self) -> int:
        return self._num

    def gather(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pool_indices = np.asarray(indices) % len(self._images)
        return self._images[pool_indices], self._labels[pool_indices]
