"""Tests for jaxpar.data: batch determinism, augmentation, eval, shapes10, TFDS, prefetch."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import ml_collections
import numpy as np
import pytest

from jaxpar.data import DataError, Dataset, DatasetSpec, Prefetcher, load, shapes10
from jaxpar.data import augment as augment_lib
from jaxpar.data.base import ArraySource

REPO = Path(__file__).resolve().parents[1]


def make_config(**data) -> ml_collections.ConfigDict:
    base = {
        "name": "shapes10",
        "data_dir": "",
        "eval_split": "test",
        "augment": False,
        "image_shape": (32, 32, 3),
        "num_classes": 10,
        "num_train": 0,
        "num_eval": 0,
    }
    return ml_collections.ConfigDict({"seed": 7, "data": {**base, **data}})


def indexed_dataset(num_train: int, num_eval: int, seed: int = 0) -> Dataset:
    """A dataset whose label is the example index, and whose image encodes it too."""

    def split(n):
        idx = np.arange(n)
        images = np.broadcast_to((idx % 251)[:, None, None, None], (n, 8, 8, 3))
        return ArraySource(np.ascontiguousarray(images, dtype=np.uint8), idx.astype(np.int32))

    spec = DatasetSpec("indexed", (8, 8, 3), num_train, num_train, num_eval)
    return Dataset(spec, split(num_train), split(num_eval), seed=seed)


# ----------------------------------------------------------------------------- train batches


@pytest.mark.parametrize("augment", [False, True])
def test_train_batch_is_a_function_of_seed_and_step(augment):
    ds = load(make_config(num_train=200, num_eval=20, augment=augment))
    a, b = ds.train_batch(5, 32), ds.train_batch(5, 32)
    np.testing.assert_array_equal(a["image"], b["image"])
    np.testing.assert_array_equal(a["label"], b["label"])
    assert a["image"].shape == (32, 32, 32, 3) and a["image"].dtype == np.float32
    assert a["label"].shape == (32,) and a["label"].dtype == np.int32
    assert not np.array_equal(a["image"], ds.train_batch(6, 32)["image"])
    # A fresh Dataset (as after a restart) replays the same batch.
    again = load(make_config(num_train=200, num_eval=20, augment=augment))
    np.testing.assert_array_equal(again.train_batch(5, 32)["image"], a["image"])
    other_seed = make_config(num_train=200, num_eval=20, augment=augment)
    other_seed.seed = 8
    assert not np.array_equal(load(other_seed).train_batch(5, 32)["label"], a["label"])


@pytest.mark.parametrize("augment", [False, True])
def test_process_slices_concatenate_to_the_global_batch(augment):
    ds = load(make_config(num_train=100, num_eval=10, augment=augment))
    for step in (0, 3):  # Step 3 straddles the epoch boundary (positions 96..127).
        whole = ds.train_batch(step, 32)
        for count in (2, 4):
            parts = [ds.train_batch(step, 32, p, count) for p in range(count)]
            assert all(part["label"].shape == (32 // count,) for part in parts)
            for key in ("image", "label"):
                np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), whole[key])


def test_each_process_reads_only_its_examples():
    ds = indexed_dataset(64, 8)
    read = []
    gather = ds.train_source.gather
    ds.train_source.gather = lambda idx: (read.append(np.array(idx)), gather(idx))[1]
    ds.train_batch(1, 16, 2, 4)
    assert len(read) == 1 and len(read[0]) == 4
    np.testing.assert_array_equal(read[0], ds.train_indices(1, 16)[8:12])


def test_epoch_order_is_the_documented_permutation_and_covers_each_example_once():
    seed, n, batch = 3, 96, 32
    ds = indexed_dataset(n, 8, seed=seed)
    for epoch in (0, 1):
        labels = np.concatenate([ds.train_batch(epoch * 3 + s, batch)["label"] for s in range(3)])
        np.testing.assert_array_equal(np.sort(labels), np.arange(n))
        np.testing.assert_array_equal(labels, np.random.default_rng([seed, epoch]).permutation(n))
    assert not np.array_equal(ds.train_batch(0, batch)["label"], ds.train_batch(3, batch)["label"])


def test_batch_straddling_epochs_takes_the_tail_then_the_next_head():
    ds = indexed_dataset(100, 8, seed=1)
    labels = ds.train_batch(3, 32)["label"]
    perm0 = np.random.default_rng([1, 0]).permutation(100)
    perm1 = np.random.default_rng([1, 1]).permutation(100)
    np.testing.assert_array_equal(labels, np.concatenate([perm0[96:], perm1[:28]]))


def test_images_are_normalised_from_uint8():
    ds = load(make_config(num_train=64, num_eval=8))
    raw, _ = ds.train_source.gather(ds.train_indices(2, 16))
    got = ds.train_batch(2, 16)["image"]
    np.testing.assert_allclose(got, (raw / 255.0 - 0.5) / 0.25, atol=1e-6)


def test_bad_batch_arguments_are_one_line_errors():
    ds = indexed_dataset(32, 8)
    for args in [(0, 10, 0, 4), (0, 8, 4, 4), (-1, 8, 0, 1)]:
        with pytest.raises(DataError) as err:
            ds.train_batch(*args)
        assert "\n" not in str(err.value)
    with pytest.raises(DataError, match="multiple of the process count 4"):
        ds.eval_batches(10, 0, 4)  # Raised at the call, not at the first next().


# ----------------------------------------------------------------------------- augmentation


def test_augmentation_is_a_per_example_zero_pad_crop_and_flip():
    plain = load(make_config(num_train=128, num_eval=8))
    aug = load(make_config(num_train=128, num_eval=8, augment=True))
    a, p = aug.train_batch(1, 64), plain.train_batch(1, 64)
    assert a["image"].shape == p["image"].shape and a["image"].dtype == np.float32
    np.testing.assert_array_equal(a["label"], p["label"])
    assert not np.array_equal(a["image"], p["image"])

    raw, _ = plain.train_source.gather(plain.train_indices(1, 64))
    padded = np.pad(raw, ((0, 0), (4, 4), (4, 4), (0, 0)))  # Zero padding.
    chosen = []
    for i in range(64):
        matches = [
            (dy, dx, f)
            for dy in range(9)
            for dx in range(9)
            for f in (0, 1)
            if np.allclose(a["image"][i], _norm(_crop(padded[i], dy, dx, f)), atol=1e-5)
        ]
        assert matches, f"example {i} is not a 4-pixel zero-pad crop/flip of its source"
        chosen.append(matches[0])
    offsets = {(dy, dx) for dy, dx, _ in chosen}
    flips = [f for _, _, f in chosen]
    assert len(offsets) > 10 and 0 < sum(flips) < 64  # Drawn per example, not per batch.


def _crop(image, dy, dx, flip):
    crop = image[dy : dy + 32, dx : dx + 32]
    return crop[:, ::-1] if flip else crop


def _norm(x):
    return (x / 255.0 - 0.5) / 0.25


def test_pad_crop_flip_matches_a_per_example_loop():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (16, 12, 10, 2), dtype=np.uint8)
    params = augment_lib.draw_params(rng, 16)
    padded = np.pad(images, ((0, 0), (4, 4), (4, 4), (0, 0)))
    expect = [
        padded[i, params.dy[i] : params.dy[i] + 12, params.dx[i] : params.dx[i] + 10]
        for i in range(16)
    ]
    expect = np.stack([e[:, ::-1] if f else e for e, f in zip(expect, params.flip)])
    np.testing.assert_array_equal(augment_lib.pad_crop_flip(images, params), expect)


# ----------------------------------------------------------------------------- eval batches


@pytest.mark.parametrize("count", [1, 2])
def test_eval_batches_cover_every_example_once_with_an_exact_mask(count):
    ds = indexed_dataset(16, 50)
    batches = [[b for b in ds.eval_batches(16, p, count)] for p in range(count)]
    assert ds.eval_steps(16) == 4 and all(len(bs) == 4 for bs in batches)
    labels, masks = [], []
    for step in range(4):  # Reassemble each global batch from the process slices.
        labels.append(np.concatenate([batches[p][step]["label"] for p in range(count)]))
        masks.append(np.concatenate([batches[p][step]["mask"] for p in range(count)]))
        for p in range(count):
            b = batches[p][step]
            assert b["image"].shape == (16 // count, 8, 8, 3) and b["mask"].dtype == np.float32
    labels, masks = np.concatenate(labels), np.concatenate(masks)
    assert masks.sum() == 50
    np.testing.assert_array_equal(labels[masks == 1], np.arange(50))
    np.testing.assert_array_equal(masks, (np.arange(64) < 50).astype(np.float32))


# ----------------------------------------------------------------------------- shapes10


def test_shapes10_spec_balance_and_determinism():
    ds = load(make_config())
    assert ds.spec == DatasetSpec("shapes10", (32, 32, 3), 10, 10_000, 2_000)
    images, labels = shapes10.generate(1000, "train")
    assert images.shape == (1000, 32, 32, 3) and images.dtype == np.uint8
    np.testing.assert_array_equal(np.bincount(labels, minlength=10), np.full(10, 100))
    fresh_images, fresh_labels = shapes10.generate.__wrapped__(1000, "train")  # Uncached.
    np.testing.assert_array_equal(fresh_images, images)
    np.testing.assert_array_equal(fresh_labels, labels)
    eval_images, _ = shapes10.generate(1000, "eval")
    assert not np.array_equal(eval_images, images)
    assert images.std() > 40  # Varied colours and noise, not blank canvases.


def _shape_features(images):
    """Translation-invariant shape signature: |FFT| of the foreground-deviation map."""
    x = images.astype(np.float32)
    median = np.median(x.reshape(len(x), -1, 3), axis=1)[:, None, None, :]
    mask = np.abs(x - median).sum(-1)
    mask /= mask.max((1, 2), keepdims=True) + 1e-6
    return np.log1p(np.abs(np.fft.rfft2(mask))[:, :12, :12].reshape(len(x), -1))


def _nearest_class_mean_accuracy(train_x, train_y, eval_x, eval_y):
    mu, sd = train_x.mean(0), train_x.std(0) + 1e-6
    train_x, eval_x = (train_x - mu) / sd, (eval_x - mu) / sd
    means = np.stack([train_x[train_y == c].mean(0) for c in range(10)])
    dist = (eval_x**2).sum(1)[:, None] - 2 * eval_x @ means.T + (means**2).sum(1)[None]
    return float((dist.argmin(1) == eval_y).mean())


def test_shapes10_is_learnable_but_not_linearly_trivial():
    train_x, train_y = shapes10.generate(2000, "train")
    eval_x, eval_y = shapes10.generate(500, "eval")
    shape_acc = _nearest_class_mean_accuracy(
        _shape_features(train_x), train_y, _shape_features(eval_x), eval_y
    )
    pixel_acc = _nearest_class_mean_accuracy(
        train_x.reshape(2000, -1) / 255.0, train_y, eval_x.reshape(500, -1) / 255.0, eval_y
    )
    assert shape_acc > 0.6, shape_acc  # ~0.87: the shape carries the label.
    assert pixel_acc < 0.3, pixel_acc  # ~0.1: colours and positions do not.


# ----------------------------------------------------------------------------- synthetic


def test_synthetic_follows_the_config():
    ds = load(
        make_config(
            name="synthetic",
            image_shape=(16, 12, 1),
            num_classes=5,
            num_train=1000,
            num_eval=30,
            augment=True,
        )
    )
    assert ds.spec == DatasetSpec("synthetic", (16, 12, 1), 5, 1000, 30)
    batch = ds.train_batch(4, 64, 1, 2)
    assert batch["image"].shape == (32, 16, 12, 1) and batch["image"].dtype == np.float32
    assert batch["label"].min() >= 0 and batch["label"].max() < 5
    assert len(np.unique(batch["label"])) > 1
    assert sum(b["mask"].sum() for b in ds.eval_batches(8)) == 30


# ----------------------------------------------------------------------------- TFDS


@pytest.fixture
def tfds_mock(monkeypatch):
    """tfds.testing.mock_data, with its broken batched read fixed.

    TFDS 4.9.10's mock assigns __getitems__ as an unbound partial that expects
    `self`, so data_source.__getitems__ raises TypeError; patch the helper.
    """
    import tensorflow_datasets as tfds
    from tensorflow_datasets.testing import mocking

    def getitems(record_keys, generator, serialized=False):
        assert not serialized
        return [generator[k] for k in record_keys]

    monkeypatch.setattr(mocking, "_getitems", getitems)
    with tfds.testing.mock_data(num_examples=20, policy=tfds.testing.MockPolicy.USE_CODE):
        yield


@pytest.mark.parametrize("name, shape", [("cifar10", (32, 32, 3)), ("mnist", (28, 28, 1))])
def test_tfds_catalog_datasets_through_mock_data(tfds_mock, name, shape):
    ds = load(make_config(name=name, data_dir="/nonexistent"))
    assert ds.spec == DatasetSpec(name, shape, 10, 20, 20)
    batch = ds.train_batch(2, 8, 1, 2)  # Straddles the 20-example epoch.
    assert batch["image"].shape == (4, *shape) and batch["image"].dtype == np.float32
    assert batch["label"].dtype == np.int32 and batch["label"].max() < 10
    assert batch["image"].min() >= -2.0 and batch["image"].max() <= 2.0
    evals = list(ds.eval_batches(8))
    assert len(evals) == 3 and sum(b["mask"].sum() for b in evals) == 20
    # data.num_train / num_eval take the first examples of a TFDS split, as for the embedded sets
    part = load(make_config(name=name, data_dir="/nonexistent", num_train=12, num_eval=5))
    assert (part.spec.num_train, part.spec.num_eval) == (12, 5)
    assert set(part.train_indices(0, 12)) == set(range(12))
    np.testing.assert_array_equal(
        next(part.eval_batches(5))["image"], next(ds.eval_batches(8))["image"][:5]
    )


BUILDER_NAME = "jaxpar_tiny_test_set"


def _png(array):
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def _tiny_image(i):
    """Image i encodes i in its first pixel, so a reader can be checked against it."""
    image = np.full((8, 8, 3), 200, np.uint8)
    image[0, 0, 0] = i
    return image


@pytest.fixture(scope="module")
def tiny_data_dir(tmp_path_factory):
    """A dataset outside TFDS's catalog, prepared as array_record without TF."""
    import tensorflow_datasets as tfds

    class JaxparTinyTestSet(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self,
                features=tfds.features.FeaturesDict(
                    {
                        "image": tfds.features.Image(shape=(8, 8, 3)),  # PNG bytes: no TF needed.
                        "label": tfds.features.ClassLabel(num_classes=3),
                    }
                ),
            )

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(0, 24), "test": self._generate_examples(24, 7)}

        def _generate_examples(self, start, count):
            for i in range(start, start + count):
                yield i, {"image": _png(_tiny_image(i)), "label": i % 3}

    data_dir = tmp_path_factory.mktemp("tfds")
    JaxparTinyTestSet(data_dir=str(data_dir), file_format="array_record").download_and_prepare()
    return data_dir


def test_uncatalogued_dataset_loads_in_a_fresh_process(tiny_data_dir):
    script = textwrap.dedent(f"""
        import sys, ml_collections, numpy as np
        from jaxpar.data import load
        cfg = ml_collections.ConfigDict({{"seed": 0, "data": {{
            "name": "{BUILDER_NAME}", "data_dir": "{tiny_data_dir}", "augment": False}}}})
        ds = load(cfg)
        print(ds.spec)
        ids, labels = [], []
        for s in range(2):
            b = ds.train_batch(s, 12)
            ids += np.rint(b["image"][:, 0, 0, 0] * 0.25 * 255 + 127.5).astype(int).tolist()
            labels += b["label"].tolist()
        print(ids)
        print(labels)
        print("tensorflow" in sys.modules)
    """)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    spec, ids, labels, tf_loaded = out.stdout.strip().splitlines()[-4:]
    assert spec == repr(DatasetSpec(BUILDER_NAME, (8, 8, 3), 3, 24, 7))
    ids, labels = eval(ids), eval(labels)
    assert sorted(ids) == list(range(24))  # One epoch: every written example once.
    assert labels == [i % 3 for i in ids]  # Each label travels with its image.
    assert tf_loaded == "False"


def test_uncatalogued_dataset_eval_split_and_bad_split(tiny_data_dir):
    ds = load(make_config(name=BUILDER_NAME, data_dir=str(tiny_data_dir)))
    batches = list(ds.eval_batches(4))
    ids = np.concatenate([np.rint(b["image"][:, 0, 0, 0] * 0.25 * 255 + 127.5) for b in batches])
    mask = np.concatenate([b["mask"] for b in batches])
    assert sorted(ids[mask == 1].astype(int).tolist()) == list(range(24, 31))
    with pytest.raises(DataError, match="available splits: train, test") as err:
        load(make_config(name=BUILDER_NAME, data_dir=str(tiny_data_dir), eval_split="validation"))
    assert "\n" not in str(err.value)


def test_tfrecord_prepared_dataset_says_to_reprepare_as_array_record(tiny_data_dir, tmp_path):
    # TFDS's default format is tfrecord; writing one needs TF, so relabel our array_record copy.
    copy = tmp_path / "tfds"
    shutil.copytree(tiny_data_dir, copy)
    info = copy / BUILDER_NAME / "1.0.0" / "dataset_info.json"
    text = info.read_text()
    assert '"fileFormat": "array_record"' in text
    info.write_text(text.replace('"fileFormat": "array_record"', '"fileFormat": "tfrecord"'))
    with pytest.raises(DataError, match="stored as tfrecord.*file_format='array_record'") as err:
        load(make_config(name=BUILDER_NAME, data_dir=str(copy)))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["cifar10", "surely_not_a_dataset_xyz"])
def test_missing_dataset_is_a_one_line_error_pointing_to_shapes10(tmp_path, name):
    start = time.perf_counter()
    with pytest.raises(DataError) as err:
        load(make_config(name=name, data_dir=str(tmp_path)))
    message = str(err.value)
    assert "\n" not in message
    assert "shapes10" in message and str(tmp_path) in message and "not prepared" in message
    if name == "cifar10":  # In the catalog: say how to prepare it.
        assert "download_and_prepare" in message and "pip install tensorflow" in message
    assert time.perf_counter() - start < 10  # No network round trips.


# ----------------------------------------------------------------------------- Prefetcher


def test_prefetcher_yields_steps_in_order_with_put_applied():
    put_threads = set()

    def put(batch):
        put_threads.add(threading.current_thread().name)
        return {"x": batch["x"] * 10}

    with Prefetcher(lambda s: {"x": np.array(s)}, put, 3, 9, depth=2) as it:
        got = [(step, int(b["x"])) for step, b in it]
    assert got == [(s, 10 * s) for s in range(3, 9)]
    assert put_threads == {"jaxpar-prefetch"}  # The copy happens off the main thread.
    assert list(Prefetcher(lambda s: {}, lambda b: b, 5, 5)) == []


def test_prefetcher_reraises_producer_errors():
    made, producers = [], set()  # the steps made, and by which thread (as make_batch sees it)

    def make_batch(step):
        producers.add(threading.current_thread())
        made.append(step)
        if step == 2:
            raise RuntimeError("bad batch 2")
        return {"step": step}

    it = Prefetcher(make_batch, lambda b: b, 0, 10)
    assert [s for s, _ in (next(it), next(it))] == [0, 1]
    with pytest.raises(RuntimeError, match="bad batch 2"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)
    (producer,) = producers
    assert producer is not threading.main_thread() and producer.name == "jaxpar-prefetch"
    producer.join(2)
    assert not producer.is_alive() and made == [0, 1, 2]  # the error ended it


def test_prefetcher_close_after_partial_consumption_stops_the_thread():
    made, producers = [], set()

    def make_batch(step):
        producers.add(threading.current_thread())
        made.append(step)
        return {"s": step}

    it = Prefetcher(make_batch, lambda b: b, 0, 10**9, depth=2)
    for step, _ in it:
        if step == 3:
            break
    it.close(timeout=2)  # waits at most 2 s for the thread to end
    (producer,) = producers
    assert producer is not threading.main_thread() and not producer.is_alive()
    # Made in order: the 4 consumed, the 2 queued, and at most one in flight.
    assert made == list(range(len(made))) and len(made) <= 4 + 2 + 1
    with pytest.raises(StopIteration):
        next(it)


def test_prefetcher_feeds_sharded_device_arrays():
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    ds = load(make_config(num_train=64, num_eval=8, augment=True))

    def put(batch):
        return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), batch)

    with Prefetcher(lambda s: ds.train_batch(s, 16), put, 0, 3) as it:
        for step, batch in it:
            assert batch["image"].sharding == sharding and batch["image"].shape == (16, 32, 32, 3)
            expect = ds.train_batch(step, 16)["label"]
            np.testing.assert_array_equal(np.asarray(batch["label"]), expect)
