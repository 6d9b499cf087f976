"""`load(config)`: picks the dataset named by config.data.name and builds a Dataset.

config.data keys (missing, None, "" or 0 mean the default):
  name         "shapes10" or "digits" (embedded, offline), "synthetic", or a TFDS name
  data_dir     TFDS data directory; default TFDS's own (~/tensorflow_datasets)
  train_split  TFDS train split, default "train"
  eval_split   TFDS eval split, default "test"
  augment      pad-crop-flip training augmentation, default False
  image_shape  synthetic only, default (32, 32, 3)
  num_classes  synthetic only, default 10
  num_train    shapes10 default 10000, digits default 60000, synthetic default 50000;
               TFDS: the first num_train examples of the train split (default all)
  num_eval     shapes10 default 2000, digits default 10000, synthetic default 10000;
               TFDS: the first num_eval examples of the eval split (default all)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxpar.data import digits, shapes10, synthetic
from jaxpar.data.base import ArraySource, DataError, Dataset, DatasetSpec, Prefix

SYNTHETIC_DEFAULTS = {
    "image_shape": (32, 32, 3),
    "num_classes": 10,
    "num_train": 50_000,
    "num_eval": 10_000,
}


def _get(cfg: Any, key: str, default: Any) -> Any:
    """cfg[key], or `default` when the key is missing or set to None, "" or 0."""
    value = cfg.get(key, None) if hasattr(cfg, "get") else getattr(cfg, key, None)
    unset = value is None or (type(value) in (str, int) and not value)  # bool False is set.
    return default if unset else value


def _int(cfg: Any, key: str, default: int) -> int:
    value = int(_get(cfg, key, default))
    if value < 0:
        raise DataError(f"config.data.{key} must be >= 0, got {value}")
    return value


def _load_embedded(module: Any, data: Any, seed: int, augment: bool) -> Dataset:
    """One of the datasets generated in-process (shapes10, digits: `module`)."""
    num_train = _int(data, "num_train", module.NUM_TRAIN)
    num_eval = _int(data, "num_eval", module.NUM_EVAL)
    train = ArraySource(*module.generate(num_train, "train"))
    evaluation = ArraySource(*module.generate(num_eval, "eval"))
    name = module.__name__.rsplit(".", 1)[-1]
    shape = tuple(train.images.shape[1:])
    spec = DatasetSpec(name, shape, module.NUM_CLASSES, num_train, num_eval)
    return Dataset(spec, train, evaluation, seed=seed, augment=augment)


def _load_synthetic(data: Any, seed: int, augment: bool) -> Dataset:
    shape = tuple(int(d) for d in _get(data, "image_shape", SYNTHETIC_DEFAULTS["image_shape"]))
    if len(shape) != 3:
        raise DataError(f"config.data.image_shape must be (H, W, C), got {shape}")
    num_classes = _int(data, "num_classes", SYNTHETIC_DEFAULTS["num_classes"])
    num_train = _int(data, "num_train", SYNTHETIC_DEFAULTS["num_train"])
    num_eval = _int(data, "num_eval", SYNTHETIC_DEFAULTS["num_eval"])
    train = synthetic.PooledSource(num_train, shape, num_classes, split_id=0)
    evaluation = synthetic.PooledSource(num_eval, shape, num_classes, split_id=1)
    spec = DatasetSpec("synthetic", shape, num_classes, num_train, num_eval)
    return Dataset(spec, train, evaluation, seed=seed, augment=augment)


def load(config: Any) -> Dataset:
    """Builds the Dataset described by `config.data`, shuffled by `config.seed`."""
    data = _get(config, "data", None)
    if data is None:
        raise DataError("config has no `data` section; set config.data.name, e.g. shapes10")
    seed = int(_get(config, "seed", 0))
    name = str(_get(data, "name", "shapes10"))
    augment = bool(_get(data, "augment", False))
    if name == "shapes10":
        return _load_embedded(shapes10, data, seed, augment)
    if name == "digits":
        return _load_embedded(digits, data, seed, augment)
    if name == "synthetic":
        return _load_synthetic(data, seed, augment)
    from jaxpar.data import tfds_source  # Deferred: only TFDS runs pay for the import.

    full = tfds_source.load_tfds(
        name,
        data_dir=_get(data, "data_dir", None),
        train_split=str(_get(data, "train_split", "train")),
        eval_split=str(_get(data, "eval_split", "test")),
        seed=seed,
        augment=augment,
    )
    return _first(full, _int(data, "num_train", 0), _int(data, "num_eval", 0))


def _first(ds: Dataset, num_train: int, num_eval: int) -> Dataset:
    """`ds` cut to the first num_train / num_eval examples of its splits (0: all), so that
    data.num_train means the same for a TFDS dataset as for the embedded ones."""
    if not num_train and not num_eval:
        return ds
    n_train = min(num_train or ds.spec.num_train, ds.spec.num_train)
    n_eval = min(num_eval or ds.spec.num_eval, ds.spec.num_eval)
    spec = dataclasses.replace(ds.spec, num_train=n_train, num_eval=n_eval)
    train, evals = Prefix(ds.train_source, n_train), Prefix(ds.eval_source, n_eval)
    return Dataset(spec, train, evals, ds.seed, ds.augment)
