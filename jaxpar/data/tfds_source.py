"""TFDS datasets read without TensorFlow: random access to array_record files.

`tfds.builder(name, data_dir=...)` also finds datasets that are not in TFDS's
catalog but were prepared into data_dir (it builds a read-only builder from
the dataset_info.json it finds there), so no builder code needs importing.
Images are decoded by TFDS with Pillow (or OpenCV when installed).
"""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np

from jaxpar.data.base import DataError, Dataset, DatasetSpec


class TFDSSource:
    """Adapts a TFDS random-access data source to `gather` -> (images, labels)."""

    def __init__(self, source: Any, name: str, split: str):
        self._source = source
        self._where = f"{name}[{split}]"

    def __len__(self) -> int:
        return len(self._source)

    def gather(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        keys = [int(i) for i in indices]
        getitems = getattr(self._source, "__getitems__", None)
        if getitems is not None:  # Batched read: array_record fetches in parallel.
            records = getitems(keys)
        else:
            records = [self._source[k] for k in keys]
        images = np.stack([np.asarray(r["image"]) for r in records])
        if images.ndim == 3:  # Grayscale delivered as [H, W].
            images = images[..., None]
        if images.dtype != np.uint8:
            raise DataError(f"{self._where}: images are {images.dtype}, only uint8 is supported")
        labels = np.asarray([r["label"] for r in records], dtype=np.int32)
        return images, labels


def _not_prepared(name: str, root: str, in_catalog: bool = True) -> DataError:
    if not in_catalog:
        return DataError(
            f"dataset {name!r} is not in TFDS's catalog and not prepared in {root} (no "
            f"{root}/{name}/<version>/dataset_info.json): check data.name and data.data_dir, "
            f"or use the embedded offline dataset data.name=shapes10"
        )
    return DataError(
        f"dataset {name!r} is not prepared in {root}: on a machine with internet run "
        f'`pip install tensorflow tensorflow-datasets && python -c "import '
        f"tensorflow_datasets as tfds; tfds.builder('{name}', data_dir='{root}', "
        f"file_format='array_record').download_and_prepare()\"` and copy {root}/{name} "
        f"here (set data.data_dir), or use the embedded offline dataset data.name=shapes10"
    )


def _check_split(name: str, split: str, available: list[str]) -> None:
    """Rejects unknown plain split names early (slices like 'train[:90%]' pass)."""
    if available and re.fullmatch(r"\w+", split) and split not in available:
        raise DataError(
            f"{name} has no split {split!r}; available splits: {', '.join(available)} "
            f"(set data.eval_split / data.train_split)"
        )


def _open_split(builder: Any, name: str, split: str, root: str) -> TFDSSource:
    """Opens one split, turning TFDS's many failure modes into one-line DataErrors."""
    try:
        source = builder.as_data_source(split=split)
    except Exception as e:
        if not builder.is_prepared():
            raise _not_prepared(name, root) from e
        if isinstance(e, NotImplementedError):
            fmt = getattr(builder.info.file_format, "value", builder.info.file_format)
            raise DataError(
                f"{name} in {root} is stored as {fmt}, which has no random access: "
                f"re-prepare it with file_format='array_record' or convert it with `tfds "
                f"convert_format --dataset_version_dir={builder.data_dir} "
                f"--out_file_format=array_record` (both need TensorFlow)"
            ) from e
        if isinstance(e, ValueError) and "split" in str(e).lower():
            available = ", ".join(builder.info.splits)
            raise DataError(f"{name}: bad split {split!r}; available splits: {available}") from e
        raise
    return TFDSSource(source, name, split)


def load_tfds(
    name: str,
    data_dir: str | None,
    train_split: str,
    eval_split: str,
    seed: int,
    augment: bool,
) -> Dataset:
    """A Dataset over a prepared TFDS dataset with `image` and `label` features.

    Never downloads: this is `tfds.data_source(name, split, data_dir, download=False)`,
    done through one builder so its info is read once for both splits.
    """
    import tensorflow_datasets as tfds  # Deferred: importing TFDS is slow (python -X importtime).
    from tensorflow_datasets.core import constants

    data_dir = os.path.expanduser(data_dir) if data_dir else None
    root = str(data_dir or constants.DATA_DIR)
    try:
        builder = tfds.builder(name, data_dir=data_dir or None)
    except tfds.core.registered.DatasetNotFoundError:
        raise _not_prepared(name, root, in_catalog=False) from None
    info = builder.info
    features = info.features
    if "image" not in features or "label" not in features:
        raise DataError(f"{name} has features {sorted(features)}; jaxpar needs 'image' and 'label'")
    shape = tuple(features["image"].shape)
    if len(shape) == 2:
        shape = (*shape, 1)
    if len(shape) != 3 or any(d is None for d in shape):
        raise DataError(
            f"{name} images have shape {shape}; only fixed-size (H, W, C) images are "
            f"supported, so prepare a resized variant of the dataset"
        )
    num_classes = getattr(features["label"], "num_classes", None)
    if not num_classes:
        raise DataError(f"{name}: 'label' is not a ClassLabel, so the number of classes is unknown")

    available = list(info.splits)
    _check_split(name, train_split, available)
    _check_split(name, eval_split, available)
    train = _open_split(builder, name, train_split, root)
    evaluation = _open_split(builder, name, eval_split, root)
    # Sizes come from the sources: info.splits is empty under tfds.testing.mock_data.
    spec = DatasetSpec(
        name=name,
        image_shape=(int(shape[0]), int(shape[1]), int(shape[2])),
        num_classes=int(num_classes),
        num_train=len(train),
        num_eval=len(evaluation),
    )
    return Dataset(spec, train, evaluation, seed=seed, augment=augment)
