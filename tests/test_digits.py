"""Tests for the embedded digits dataset: determinism, shapes, balance, disjoint splits, loading.

Small draws only; the time of the full 70,000 images is in benchmarks/digits_generation.py.
"""

from __future__ import annotations

import ml_collections
import numpy as np
import pytest

from jaxpar.data import DatasetSpec, digits, load


def make_config(**data) -> ml_collections.ConfigDict:
    base = {"name": "digits", "data_dir": "", "eval_split": "test", "augment": False}
    return ml_collections.ConfigDict({"seed": 3, "data": {**base, **data}})


def test_same_seed_and_split_give_identical_bytes_and_splits_differ():
    images, labels = digits.generate(2000, "train")
    fresh_images, fresh_labels = digits.generate.__wrapped__(2000, "train")  # Uncached.
    assert fresh_images.tobytes() == images.tobytes()
    np.testing.assert_array_equal(fresh_labels, labels)
    eval_images, _ = digits.generate(2000, "eval")
    assert eval_images.tobytes() != images.tobytes()
    other_seed, _ = digits.generate.__wrapped__(200, "train", seed=1)
    assert not np.array_equal(other_seed, images[:200])
    assert not images.flags.writeable and not labels.flags.writeable  # Shared cache.


def test_shapes_dtype_labels_and_balance():
    images, labels = digits.generate(2000, "train")
    assert images.shape == (2000, 28, 28, 1) and images.dtype == np.uint8
    assert np.issubdtype(labels.dtype, np.integer) and labels.shape == (2000,)
    assert labels.min() == 0 and labels.max() == 9
    share = np.bincount(labels, minlength=10) / len(labels)
    assert np.all((share >= 0.07) & (share <= 0.13)), share
    # MNIST-like: dark background, bright strokes that cover a minority of the pixels.
    assert 15 < images.mean() < 60, images.mean()
    ink = (images > 64).mean((1, 2, 3))  # Some hard strokes are faint: no 128 threshold.
    assert np.all(ink > 0.01) and np.median(ink) < 0.3  # No blank and no filled canvases.


def test_train_and_eval_draws_are_disjoint():
    train, _ = digits.generate(3000, "train")
    evaluation, _ = digits.generate(3000, "eval")
    train_rows = {row.tobytes() for row in train}
    assert len(train_rows) == len(train)  # No repeats within a split either.
    assert not any(row.tobytes() in train_rows for row in evaluation)


def test_classes_differ_on_average():
    """Every class's mean image is nearer its own held-out examples than the others' are."""
    images, labels = digits.generate(2000, "train")
    x = images.reshape(len(images), -1).astype(np.float32) / 255
    means = np.stack([x[:1000][labels[:1000] == c].mean(0) for c in range(10)])
    dist = ((x[1000:, None, :] - means[None]) ** 2).sum(-1)
    accuracy = (dist.argmin(1) == labels[1000:]).mean()
    assert 0.4 < accuracy < 0.95, accuracy  # Learnable, but not by a template match.


def test_bad_split_is_a_clear_error():
    with pytest.raises(ValueError, match="digits split must be one of"):
        digits.generate(10, "test")


def test_load_gives_the_digits_spec():
    ds = load(make_config(num_train=1000, num_eval=300))
    assert ds.spec == DatasetSpec("digits", (28, 28, 1), 10, 1000, 300)
    batch = ds.train_batch(0, 32)
    assert batch["image"].shape == (32, 28, 28, 1) and batch["image"].dtype == np.float32
    assert set(np.unique(batch["label"])) <= set(range(10))
    images, labels = digits.generate(1000, "train")
    raw, raw_labels = ds.train_source.gather(np.arange(1000))
    np.testing.assert_array_equal(raw, images)
    np.testing.assert_array_equal(raw_labels, labels)
    assert sum(len(b["label"]) for b in ds.eval_batches(100)) == 300


def test_load_defaults_to_mnist_sizes(monkeypatch):
    calls = []
    monkeypatch.setattr(
        digits, "generate", lambda n, split: calls.append((n, split)) or _blank(n)
    )  # The 70,000 real images are the benchmark's job, not this test's.
    ds = load(make_config(num_train=0, num_eval=0))
    assert ds.spec == DatasetSpec("digits", (28, 28, 1), 10, 60_000, 10_000)
    assert calls == [(60_000, "train"), (10_000, "eval")]


def _blank(n):
    return np.zeros((n, 28, 28, 1), np.uint8), np.arange(n, dtype=np.int32) % 10
