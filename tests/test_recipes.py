"""Large-batch recipes: linear learning-rate scaling, gradual warmup (Goyal et al. 2017) and
LARS (You et al. 2017) give the rates and steps they promise."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from jaxpar import optim
from jaxpar.run_spec import RateRule
from tests.util import tiny_config


def test_linear_scaling_with_gradual_warmup():
    config = tiny_config(
        learning_rate=0.01,
        lr_linear_scaling=True,
        lr_base_batch_size=128,
        global_batch_size=1024,
        warmup_steps=10,
        lr_schedule="constant",
        num_train_steps=100,
    )
    schedule = optim.make_schedule(RateRule.of_config(config))
    assert optim.peak_learning_rate(RateRule.of_config(config)) == pytest.approx(
        0.08
    )  # 0.01 x 1024 / 128
    rates = [float(schedule(step)) for step in (0, 5, 10, 50, 99)]
    np.testing.assert_allclose(rates, [0.0, 0.04, 0.08, 0.08, 0.08], rtol=1e-6)


def test_no_scaling_keeps_the_rate():
    config = tiny_config(learning_rate=0.01, global_batch_size=1024)
    assert optim.peak_learning_rate(RateRule.of_config(config)) == pytest.approx(0.01)


def test_lars_step_by_hand():
    # ||w|| = 5, ||g|| = 1: trust ratio 0.001 x 5 / 1 = 0.005, so the step is -lr x 0.005 x g.
    config = tiny_config(
        **{
            "optimizer.name": "lars",
            "optimizer.momentum": 0.0,
            "learning_rate": 1.0,
            "weight_decay": 0.0,
        }
    )
    tx = optim.make_optimizer(RateRule.of_config(config))
    w, g = {"w": jnp.array([3.0, 4.0])}, {"w": jnp.array([0.6, 0.8])}
    updates, _ = tx.update(g, tx.init(w), w)
    np.testing.assert_allclose(updates["w"], [-0.003, -0.004], rtol=1e-6)
