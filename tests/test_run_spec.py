"""A config resolved once: the typed values a run reads, its defaults configs/base.py's."""

import dataclasses

import ml_collections
import pytest

from configs import base
from jaxpar import optim, parallel, run_spec
from jaxpar.errors import ConfigError
from jaxpar.run_spec import RateRule
from jaxpar.target.sync_factors import sync_setting
from tests.util import override


def make(**overrides):
    return override(base.get_config(), overrides)


def test_hybrid_mesh_resolves_to_a_pipeline_with_its_batches():
    spec = parallel.resolve(
        make(
            mesh_shape=(2, 2, 2),
            global_batch_size=64,
            **{"pipeline.schedule": "1f1b", "pipeline.num_microbatches": 4},
        ),
        8,
    )
    assert spec.strategy == "pipeline"
    assert spec.mesh.axes == ("data", "stage", "tensor")
    assert spec.mesh.sizes == {"data": 2, "stage": 2, "tensor": 2}
    assert (spec.mesh.replicas, spec.mesh.num_devices) == (2, 8)
    assert spec.batches == run_spec.Batches(64, 64, 2, 1)
    assert spec.batches.per_replica == 32
    assert (spec.pipeline.schedule, spec.pipeline.num_microbatches) == ("1f1b", 4)


def test_minus_one_takes_the_devices_left_and_the_eval_batch_defaults_to_the_train_batch():
    spec = parallel.resolve(make(mesh_shape=(-1, 1, 1), global_batch_size=32), 4)
    assert spec.mesh.shape == (-1, 1, 1)
    assert spec.mesh.sizes == {"data": 4, "stage": 1, "tensor": 1}
    assert spec.strategy == "data"
    assert (spec.batches.eval_size, spec.batches.per_replica) == (32, 8)
    spec = parallel.resolve(make(global_batch_size=32, eval_batch_size=16), 4)
    assert spec.batches.eval_size == 16


def test_sync_rate_and_target_settings():
    spec = parallel.resolve(
        make(
            mesh_shape=(8, 1, 1),
            lr_linear_scaling=True,
            learning_rate=0.1,
            target_accuracy=0.8,
            stop_at_target=True,
            **{"sync.mode": "local_sgd", "sync.period": 8, "sync.batch_norm": "local"},
        ),
        8,
    )
    assert (spec.sync.mode, spec.sync.period, spec.sync.setting) == ("local_sgd", 8, 8)
    assert spec.target == run_spec.TargetSpec(0.8, 0.0, True)
    assert spec.target.wanted
    assert optim.batch_rule(spec.rate) == "linear"
    assert optim.peak_learning_rate(spec.rate) == pytest.approx(0.1 * 128 / 256)


def test_a_bad_config_fails_in_the_same_line_as_validate():
    config = make(global_batch_size=100, mesh_shape=(8, 1, 1))
    with pytest.raises(ConfigError) as validated:
        parallel.validate(config, 8)
    with pytest.raises(ConfigError) as resolved:
        parallel.resolve(config, 8)
    assert str(resolved.value) == str(validated.value)
    assert str(resolved.value) == (
        "global_batch_size 100 is not divisible by the data axis (8 replicas); use a multiple of 8"
    )


def test_every_default_is_base_py_value():
    spec = parallel.resolve(base.get_config(), 8)
    config = base.get_config()
    assert spec.train_steps == config.num_train_steps
    assert spec.seed == config.seed
    assert spec.sync == run_spec.SyncSpec(**config.sync)
    assert spec.measure == run_spec.Measure(
        config.measure_noise_scale,
        config.noise_scale_decay,
        config.log_every_steps,
        config.eval_every_steps,
        config.eval_train_examples,
    )
    assert spec.rate.base_batch == config.lr_base_batch_size
    assert spec.rate.adaptation == config.lr_adaptation
    assert run_spec.default("sync.period") == config.sync.period


def test_a_key_a_config_lacks_takes_base_py_value():
    partial = ml_collections.ConfigDict({"global_batch_size": 64, "sync": {"mode": "async"}})
    rule = RateRule.of_config(partial)
    assert rule.batch == 64
    assert rule.base_batch == base.get_config().lr_base_batch_size
    assert rule.noise_scale_decay == base.get_config().noise_scale_decay
    assert sync_setting("async", partial) == base.get_config().sync.max_staleness
    assert sync_setting("local_sgd", {"sync.period": 2}) == 2
    assert sync_setting("local_sgd", {}) == base.get_config().sync.period


def test_a_spec_is_frozen():
    spec = parallel.resolve(base.get_config(), 8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.seed = 1  # type: ignore[misc]
