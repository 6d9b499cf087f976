"""Dataset container: deterministic, process-sliced train batches and exact eval batches.

Every batch is a pure function of (seed, step), so a resumed run sees the same
data and the union of the per-process slices does not depend on the number of
processes.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from typing import Protocol

import numpy as np

from jaxpar.data import augment as augment_lib

# Images are scaled to roughly [-2, 2]: (x / 255 - 0.5) / 0.25.
_MEAN = 0.5
_STD = 0.25


class DataError(ValueError):
    """A one-line, user-facing error about data configuration or availability."""


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """Static facts about a dataset that models and trainers need."""

    name: str
    image_shape: tuple[int, int, int]  # (H, W, C)
    num_classes: int
    num_train: int
    num_eval: int


class Source(Protocol):
    """A random-access split: its length and a batched gather of examples."""

    def __len__(self) -> int: ...

    def gather(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Returns uint8 images [n, H, W, C] and int32 labels [n]."""
        ...


class ArraySource:
    """A split held in memory as numpy arrays."""

    def __init__(self, images: np.ndarray, labels: np.ndarray):
        if images.ndim != 4 or images.dtype != np.uint8:
            raise DataError(f"images must be uint8 [n, H, W, C], got {images.dtype} {images.shape}")
        if len(labels) != len(images):
            raise DataError(f"got {len(images)} images but {len(labels)} labels")
        self.images = images
        self.labels = np.asarray(labels, dtype=np.int32)

    def __len__(self) -> int:
        return len(self.images)

    def gather(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.images[indices], self.labels[indices]


class Prefix:
    """The first `n` examples of a source, as a source (the train split evaluated)."""

    def __init__(self, source: Source, n: int):
        self.source, self.n = source, min(int(n), len(source))

    def __len__(self) -> int:
        return self.n

    def gather(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.source.gather(indices)


def render_split(
    render,
    num: int,
    split: str,
    seed: int,
    *,
    name: str,
    split_ids: dict,
    num_classes: int,
    shape: tuple[int, ...],
    chunk: int,
) -> tuple[np.ndarray, np.ndarray]:
    """An embedded dataset's split: `num` uint8 images of `shape` drawn by `render(rng,
    labels)` `chunk` at a time, and balanced int32 labels. Deterministic in (num, split,
    seed); train and eval use different streams; the arrays are read-only."""
    if split not in split_ids:
        raise ValueError(f"{name} split must be one of {sorted(split_ids)}, got {split!r}")
    rng = np.random.default_rng([seed, split_ids[split]])
    labels = rng.permutation(np.arange(num) % num_classes).astype(np.int32)
    images = np.empty((num, *shape), np.uint8)
    for start in range(0, num, chunk):
        images[start : start + chunk] = render(rng, labels[start : start + chunk])
    images.setflags(write=False)
    labels.setflags(write=False)
    return images, labels


def normalize(images: np.ndarray) -> np.ndarray:
    """Maps uint8 images to float32 (x / 255 - 0.5) / 0.25."""
    scale = np.float32(1.0 / (255.0 * _STD))
    offset = np.float32(_MEAN / _STD)
    out = images.astype(np.float32)
    out *= scale
    out -= offset
    return out


@functools.lru_cache(maxsize=4)
def _epoch_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """The example order of one epoch; cached since consecutive steps share it."""
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    perm.setflags(write=False)
    return perm


def _local_slice(global_batch_size: int, process_index: int, process_count: int) -> slice:
    """This process's contiguous part of a global batch."""
    if process_count < 1 or not 0 <= process_index < process_count:
        raise DataError(
            f"process_index={process_index} is not in [0, process_count={process_count})"
        )
    if global_batch_size < 1 or global_batch_size % process_count:
        raise DataError(
            f"global batch size {global_batch_size} must be a positive multiple of "
            f"the process count {process_count}; change the batch size"
        )
    local = global_batch_size // process_count
    return slice(process_index * local, (process_index + 1) * local)


class Dataset:
    """A train and an eval split plus the rules that turn them into batches."""

    def __init__(
        self,
        spec: DatasetSpec,
        train_source: Source,
        eval_source: Source,
        seed: int = 0,
        augment: bool = False,
    ):
        sizes = (len(train_source), len(eval_source))
        if sizes != (spec.num_train, spec.num_eval):
            raise DataError(
                f"{spec.name}: sources hold {sizes[0]}/{sizes[1]} train/eval examples "
                f"but the spec says {spec.num_train}/{spec.num_eval}"
            )
        if spec.num_train < 1:
            raise DataError(f"{spec.name}: the train split is empty")
        if seed < 0:
            raise DataError(f"seed must be >= 0, got {seed}")
        self.spec = spec
        self.train_source = train_source
        self.eval_source = eval_source
        self.seed = int(seed)
        self.augment = bool(augment)

    def train_as_eval(self, n: int) -> Dataset:
        """This dataset with its eval split replaced by the first `n` train examples (all if
        `n` is larger), unaugmented: evaluated with the model in inference mode, it gives the
        train accuracy and loss that the train/test gap compares."""
        n = min(int(n), self.spec.num_train)
        spec = dataclasses.replace(self.spec, num_eval=n)
        return Dataset(spec, self.train_source, Prefix(self.train_source, n), self.seed)

    def train_indices(
        self, step: int, global_batch_size: int, offset: int | None = None
    ) -> np.ndarray:
        """Example indices of global batch `step` over the concatenated epoch orders: the
        `global_batch_size` positions after `offset` (the examples before it; by default
        step x global_batch_size, the position of a run whose batch never changed)."""
        if step < 0:
            raise DataError(f"step must be >= 0, got {step}")
        n = self.spec.num_train
        start = step * global_batch_size if offset is None else offset
        positions = start + np.arange(global_batch_size, dtype=np.int64)
        epochs, offsets = np.divmod(positions, n)
        indices = np.empty_like(positions)
        for epoch in np.unique(epochs):  # One or two epochs unless B > n.
            sel = epochs == epoch
            indices[sel] = _epoch_permutation(self.seed, int(epoch), n)[offsets[sel]]
        return indices

    def train_batch(
        self,
        step: int,
        global_batch_size: int,
        process_index: int = 0,
        process_count: int = 1,
        example_ids: bool = False,
        offset: int | None = None,
    ) -> dict[str, np.ndarray]:
        """This process's slice of global train batch `step`: image float32, label int32.
        `offset`: the examples the run has taken before it (train_indices).

        Deterministic in (seed, step, offset); only the local examples are read.
        Augmentation randomness is drawn for the whole global batch and sliced,
        so it does not depend on process_count either. `example_ids` adds "example": one
        uint32 per row, unique within a run's first 2^32 examples and mixed with the seed,
        from which dropout draws each row's mask wherever the row is computed.
        """
        local = _local_slice(global_batch_size, process_index, process_count)
        indices = self.train_indices(step, global_batch_size, offset)[local]
        images, labels = self.train_source.gather(indices)
        if self.augment:
            rng = np.random.default_rng([self.seed, step, 1])
            params = augment_lib.draw_params(rng, global_batch_size)
            images = augment_lib.pad_crop_flip(images, params.local(local))
        out = {"image": normalize(images), "label": labels.astype(np.int32, copy=False)}
        if example_ids:
            start = step * global_batch_size if offset is None else offset
            position = start + np.arange(global_batch_size, dtype=np.uint64)
            offset = np.uint64(self.seed * 0x9E3779B97F4A7C15 % 2**32)  # seeds far apart
            mixed = (position + offset) % np.uint64(2**32)
            out["example"] = mixed[local].astype(np.uint32)
        return out

    def eval_steps(self, global_batch_size: int) -> int:
        """Number of batches `eval_batches` yields (the last one padded)."""
        return -(-self.spec.num_eval // global_batch_size)

    def eval_batches(
        self,
        global_batch_size: int,
        process_index: int = 0,
        process_count: int = 1,
    ) -> Iterator[dict[str, np.ndarray]]:
        """The whole eval split in order, in fixed-size batches with a 0/1 "mask".

        Padding rows repeat example 0 with mask 0, so masked metrics are exact.
        """
        local = _local_slice(global_batch_size, process_index, process_count)  # Fails now.
        return self._eval_batches(global_batch_size, local)

    def _eval_batches(self, global_batch_size: int, local: slice) -> Iterator[dict]:
        n = self.spec.num_eval
        for i in range(self.eval_steps(global_batch_size)):
            positions = i * global_batch_size + np.arange(global_batch_size)[local]
            valid = positions < n
            images, labels = self.eval_source.gather(np.where(valid, positions, 0))
            yield {
                "image": normalize(images),
                "label": labels.astype(np.int32, copy=False),
                "mask": valid.astype(np.float32),
            }
