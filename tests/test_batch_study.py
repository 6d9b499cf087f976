"""The accuracy-against-batch study (suite batch_size): its rows are the recipes they say, the
study folds seeds and sets the seed's figures beside jaxpar's, the train split is evaluated for
the gap, and a two-row version of the suite runs end to end."""

from __future__ import annotations

import dataclasses
import math
import textwrap

import numpy as np
import pytest

from jaxpar import data as data_lib
from jaxpar import optim, parallel
from jaxpar import suites as suite_lib
from jaxpar.bench import accuracy
from jaxpar.bench.runner import Sweep
from jaxpar.data.base import normalize
from jaxpar.run_spec import RateRule
from tests.util import bench_row


def test_every_row_of_the_cifar_study_is_accepted():
    suite = suite_lib.load_suite("batch_size_cifar")
    for r in suite.rows:
        config = suite_lib.row_config(suite, r, {})
        parallel.validate(config, config.num_devices)
        assert config.model.batch_norm and config.grad_accum_steps == 1


def test_every_row_is_its_recipe_for_twelve_epochs():
    suite = suite_lib.load_suite("batch_size")
    names = [r["name"] for r in suite.rows]
    assert len(names) == len(set(names)) == 21
    for r in suite.rows:
        config = suite_lib.row_config(suite, r, {})
        parallel.validate(config, config.num_devices)  # a config the trainer accepts
        b, n = config.global_batch_size, config.num_train_steps
        assert config.data.name == "digits" and config.model.dropout and config.num_devices
        assert 12 - b / 20_000 < n * b / 20_000 <= 12  # 12 epochs, the last partial batch dropped
        lr, group = optim.peak_learning_rate(RateRule.of_config(config)), r["group"]
        if group.startswith("linear"):
            assert lr == pytest.approx(0.05 * b / 128)
        elif group.startswith("LARS"):
            assert (config.optimizer.name, lr) == ("lars", 15.0)
        else:
            assert (config.optimizer.name, lr) == ("sgd", 0.05)
        assert config.grad_accum_steps * 16 * config.num_devices == max(b, 16 * config.num_devices)
        warm = group.endswith("warmup")
        assert config.warmup_steps == (round(n / 6) if warm else 0)  # 2 of 12 epochs
    labels = {}
    for r in suite.rows:
        labels.setdefault(r["label"] or r["name"], []).append(r)
    seeded = {k: [r["config"]["seed"] for r in v] for k, v in labels.items() if len(v) > 1}
    assert seeded == {"fixed lr 128": [0, 1, 2], "LARS + warmup 4096": [0, 1, 2]}
    refs = {r["label"]: r["reference"] for r in suite.rows if r["group"] == "fixed lr"}
    assert refs["fixed lr 4096"] == 0.9633 and refs["fixed lr 1024"] == (0.9844, 0.9852)


def _row(name, label, group, batch, acc, status="ok", **extra):
    return bench_row(
        name=name,
        label=label,
        group=group,
        global_batch_size=batch,
        eval_accuracy=acc,
        status=status,
        scaling="none",
        num_devices=8,
        error=extra.pop("error", None),
        train_eval_accuracy=None if acc is None else acc + 0.01,
        final_loss=0.3,
        generalization_gap=0.01,
        epochs=12.0,
        steps=58,
        seconds_per_epoch=4.0,
        **extra,
    )


def test_the_study_folds_seeds_and_sets_the_reference_beside():
    rows = [
        _row("a", "fixed 128", "fixed lr", 128, 0.98, reference=(0.9884, 0.9905)),
        _row("a s1", "fixed 128", "fixed lr", 128, 0.97),
        _row("a s2", "fixed 128", "fixed lr", 128, None, status="failed", error="boom"),
        _row("b", "", "fixed lr", 4096, 0.5, reference=0.9633),
        dataclasses.replace(_row("throughput", "", "data", 128, 0.9), scaling="strong"),
    ]
    entries = accuracy.study(rows)
    assert [e.label for e in entries] == ["fixed 128", "b"]  # throughput rows left out
    first = entries[0]
    assert (first.seeds, first.seeds_ok) == (3, 2)
    assert first.accuracy == pytest.approx(0.975)
    assert (first.accuracy_min, first.accuracy_max) == (0.97, 0.98)
    assert first.train_accuracy == pytest.approx(0.985)
    table = accuracy.markdown(entries, "seed 002")
    assert "| seed 002 |" in table.splitlines()[0]
    assert "0.9750 (0.9700-0.9800, 2 seeds); 1 failed: boom | 0.9884-0.9905 |" in table
    err = "TrainingError: training diverged: the loss (nan) is not finite at step 48; lower it"
    assert accuracy.failure_text(err) == "diverged (nan at step 48)"
    assert "| fixed lr | 4096 | 8 | 0.5000 | 0.9633 | 0.5100 |" in table


def test_the_train_split_evaluated_is_its_first_images_unaugmented():
    ds = data_lib.load(_digits(num_train=300, num_eval=50, augment=True))
    view = ds.train_as_eval(100)
    assert (view.spec.num_eval, view.spec.num_train, view.augment) == (100, 300, False)
    batches = list(view.eval_batches(64))
    images = np.concatenate([b["image"] for b in batches])[:100]
    expect, labels = ds.train_source.gather(np.arange(100))
    np.testing.assert_array_equal(images, normalize(expect))
    assert np.concatenate([b["label"] for b in batches])[:100].tolist() == labels.tolist()
    assert sum(b["mask"].sum() for b in batches) == 100
    assert ds.train_as_eval(10**6).spec.num_eval == 300


def _digits(**keys):
    from tests.util import tiny_config

    config = tiny_config()
    config.data.name = "digits"
    for k, v in keys.items():
        config.data[k] = v
    return config


SMOKE = textwrap.dedent(
    """
    from configs.bench import batch_size as b

    def get_config():
        suite = b.get_config()
        suite.overrides.update({"model.width": 0.125, "data.num_train": 512,
                                "data.num_eval": 200, "eval_train_examples": 128,
                                "eval_batch_size": 200})
        recipes = {"fixed lr": (b.RECIPES["fixed lr"][0], (128,)),
                   "LARS + warmup": (b.RECIPES["LARS + warmup"][0], (256,))}
        suite.rows = b.rows(recipes, device_counts=(), num_train=512, epochs=2, repeated=())
        return suite
    """
)


def test_a_two_row_study_runs_end_to_end(tmp_path):
    suite = tmp_path / "smoke.py"
    suite.write_text(SMOKE)
    rows = Sweep(suite=str(suite), out=str(tmp_path / "out")).run()
    assert [(r.name, r.status) for r in rows] == [
        ("fixed lr 128", "ok"),
        ("LARS + warmup 256", "ok"),
    ]
    for r in rows:
        assert r.epochs == 2 and r.steps == 1024 // r.global_batch_size
        assert 0.0 <= r.eval_accuracy <= 1.0 and math.isfinite(r.final_loss)
        assert r.generalization_gap == pytest.approx(r.train_eval_accuracy - r.eval_accuracy)
        assert r.seconds_per_epoch == pytest.approx(512 / r.images_per_sec)
    table = (tmp_path / "out" / "accuracy.md").read_text()
    assert table.count("\n") == 4 and "seed 002 (Keras, MNIST, GPUs)" in table
    assert "| fixed lr | 128 | 8 |" in table and "| 0.9884-0.9905 |" in table
