"""Data for jaxpar: deterministic, process-sliced batches from shapes10, digits, synthetic, TFDS."""

from jaxpar.data.base import DataError, Dataset, DatasetSpec
from jaxpar.data.loader import load
from jaxpar.data.prefetch import Prefetcher

__all__ = ["DataError", "Dataset", "DatasetSpec", "Prefetcher", "load"]
