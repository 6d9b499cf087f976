"""AdaScale (lr_adaptation=adascale): the gain against hand-worked values, the optax
transformation step by step, scale 1 as plain SGD, every mesh as one device with slices, a run
whose length is progress, an exact resume, and the one-line refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxpar import adascale, metrics, run_setup, trainer
from jaxpar import gain as gain_lib
from jaxpar.errors import ConfigError
from tests.util import max_rel_error, run_steps, tiny_config


def test_gain_against_hand_worked_values():
    # B_noise = tr / |G|^2 = 64: r = (1 + 64/64) / (1 + 64/256) = 2 / 1.25
    assert float(gain_lib.gain(1.0, 64.0, 64, 256)) == pytest.approx(1.6, rel=1e-7)
    assert gain_lib.gain_at(64.0, 64, 256) == pytest.approx(1.6)
    assert gain_lib.efficiency(64.0, 64, 256) == pytest.approx(0.4)
    # below the base batch the gain is below 1: (1 + 1) / (1 + 4)
    assert float(gain_lib.gain(1.0, 64.0, 64, 16)) == pytest.approx(0.4, rel=1e-7)
    # |G|^2 not positive: all noise, the whole scale; no trace: no noise, 1
    assert float(gain_lib.gain(-3.0, 5.0, 64, 256)) == 4.0
    assert float(gain_lib.gain(2.0, -1.0, 64, 256)) == 1.0
    assert float(gain_lib.gain(0.0, 0.0, 64, 256)) == 1.0
    assert gain_lib.gain_at(float("nan"), 64, 256) == 4.0
    # at the base batch exactly 1, whatever the estimates
    assert float(gain_lib.gain(0.3, 7.1, 96, 96)) == 1.0


def test_the_transformation_step_by_step():
    """Two steps of scale_by_adascale with given norms: the averages, the gain, the rate at
    the progress (a schedule of 0.1 then 0.01 from progress 1.5) and the progress."""
    schedule = lambda p: jnp.where(p < 1.5, 0.1, 0.01)
    tx = adascale.scale_by_adascale(schedule, base_batch=8, decay=0.5)
    params = {"w": jnp.ones(3)}
    state = tx.init(params)
    ones = {"w": jnp.ones(3)}
    # b_small 8, b_big 32: |G|^2 = (32 big - 8 small) / 24, tr = (small - big) / (1/8 - 1/32)
    steps = [(5.0, 2.0), (3.0, 2.5)]
    want_progress, ema = 0.0, np.zeros(2)
    for n, (small, big) in enumerate(steps, 1):
        noise = adascale.GradNoise(jnp.float32(small), jnp.float32(big), 8.0, 32.0)
        updates, state = tx.update(ones, state, params, noise=noise)
        g2, tr = (32 * big - 8 * small) / 24, (small - big) / (1 / 8 - 1 / 32)
        ema = 0.5 * ema + 0.5 * np.array([g2, tr])
        g2_hat, tr_hat = ema / (1 - 0.5**n)
        r = (tr_hat / 8 + g2_hat) / (tr_hat / 32 + g2_hat)
        rate = (0.1 if want_progress < 1.5 else 0.01) * r
        np.testing.assert_allclose(updates["w"], -rate * np.ones(3), rtol=1e-6)
        want_progress += r
        assert float(state.gain) == pytest.approx(r, rel=1e-6)
        assert float(state.rate) == pytest.approx(rate, rel=1e-6)
        assert float(state.progress) == pytest.approx(want_progress, rel=1e-6)
    assert int(state.count) == 2
    assert adascale.find((optax.EmptyState(), (state,))) is state


def test_progress_sums_exactly_over_a_long_run():
    """The compensated sum keeps the progress within a rounding of the true sum after 200,000
    gains (a plain float32 sum drifts by hundreds)."""
    gains = np.random.default_rng(0).uniform(1, 30, 200_000).astype(np.float32)

    def body(carry, r):
        return adascale._kahan_add(*carry, r), None

    (total, _), _ = jax.lax.scan(body, (jnp.float32(0), jnp.float32(0)), gains)
    exact = float(np.sum(gains.astype(np.float64)))
    assert abs(float(total) - exact) <= np.spacing(np.float32(exact))
    assert abs(float(np.float32(np.cumsum(gains, dtype=np.float32)[-1])) - exact) > 1


def adascale_config(**overrides):
    return tiny_config(**{"lr_adaptation": "adascale", "lr_base_batch_size": 4, **overrides})


def test_at_scale_one_it_is_plain_sgd():
    """lr_base_batch_size = the global batch: the gain is 1 and every loss and parameter is
    the plain optimizer's, bit for bit."""
    plain = run_steps(tiny_config(mesh_shape=(8, 1, 1), lr_base_batch_size=16), 8, 3)
    adapted = run_steps(adascale_config(mesh_shape=(8, 1, 1), lr_base_batch_size=16), 8, 3)
    np.testing.assert_array_equal(adapted[0], plain[0])
    jax.tree.map(np.testing.assert_array_equal, adapted[1].params, plain[1].params)
    found = adascale.find(adapted[1].opt_state)
    assert float(found.gain) == 1.0 and float(found.progress) == 3.0


@pytest.fixture(scope="module")
def one_device():
    """Scale 4 on one device in 8 slices of 2 images: the function every mesh must compute
    (the same 8 small batches every step)."""
    return run_steps(adascale_config(mesh_shape=(1, 1, 1), grad_accum_steps=8), 1, 3)


@pytest.mark.parametrize(
    "overrides",
    [
        {"mesh_shape": (8, 1, 1)},
        {"mesh_shape": (2, 1, 4), "grad_accum_steps": 4},
        {"mesh_axes": ("data", "fsdp"), "mesh_shape": (2, 4)},
        {"mesh_shape": (2, 2, 2), "pipeline.num_microbatches": 4, "pipeline.schedule": "1f1b"},
        {"mesh_shape": (8, 1, 1), "sync.mode": "sharded"},
        {"mesh_shape": (8, 1, 1), "sync.mode": "parameter_server"},
        {"mesh_axes": ("node", "data"), "mesh_shape": (2, 4)},
        {"mesh_axes": ("data", "spatial"), "mesh_shape": (2, 4), "grad_accum_steps": 4},
    ],
    ids=[
        "data8",
        "data2-tensor4-slices",
        "fsdp",
        "pipeline-hybrid",
        "sharded",
        "ps",
        "node",
        "spatial",
    ],
)
def test_every_mesh_adapts_as_one_device(one_device, overrides):
    losses, state = run_steps(adascale_config(**overrides), 8, 3)
    ref_losses, ref = one_device
    assert max_rel_error(losses, ref_losses) < 1e-5
    assert max_rel_error(state.params, ref.params) < 1e-5
    got, want = adascale.find(state.opt_state), adascale.find(ref.opt_state)
    assert float(got.gain) > 1.05  # the test means something: the rate did adapt
    np.testing.assert_allclose(float(got.progress), float(want.progress), rtol=1e-5)


def cli_config(workdir_steps: int, **overrides):
    """Digit-free: the tiny model at scale 4, a run of `workdir_steps` progress."""
    return adascale_config(
        num_train_steps=workdir_steps,
        mesh_shape=(8, 1, 1),
        checkpoint_every_steps=2,
        log_every_steps=1,
        **overrides,
    )


def test_a_run_ends_when_its_progress_reaches_the_budget_and_resumes_exactly(tmp_path):
    """num_train_steps is progress: the run stops at the first step whose progress reaches
    it. Continued to a larger budget, it takes the steps and losses of a run straight there,
    bit for bit (the averages and the progress resume with the optimizer state)."""
    straight = trainer.train_and_evaluate(cli_config(14), str(tmp_path / "straight")).summary
    noise = metrics.records(str(tmp_path / "straight"), "noise")
    progress = [r["progress"] for r in noise]
    assert progress[-1] >= 14 > progress[-2]
    assert straight.steps == len(noise) < 14  # fewer steps than progress: gains above 1
    assert straight.adapted.progress == pytest.approx(progress[-1])
    assert straight.adapted.mean_gain == pytest.approx(progress[-1] / straight.steps)
    assert all(1 <= r["gain"] <= 4 for r in noise)
    np.testing.assert_allclose(np.diff(progress), [r["gain"] for r in noise[1:]], rtol=1e-5)

    first = trainer.train_and_evaluate(cli_config(6), str(tmp_path / "resumed")).summary
    assert first.steps < straight.steps
    trainer.train_and_evaluate(cli_config(14), str(tmp_path / "resumed"))
    want = [r["loss"] for r in metrics.records(str(tmp_path / "straight"), "train")]
    got = [r["loss"] for r in metrics.records(str(tmp_path / "resumed"), "train")]
    assert got == want
    resumed = [r["progress"] for r in metrics.records(str(tmp_path / "resumed"), "noise")]
    assert resumed == progress


@pytest.mark.parametrize(
    "overrides,says",
    [
        ({"sync.mode": "local_sgd"}, "forms no combined gradient"),
        ({"model.batch_norm": True}, "sync.batch_norm=local"),
        ({"mesh_shape": (1, 1, 1)}, "grad_accum_steps=2"),
        ({"measure_noise_scale": False}, "measure_noise_scale=False"),
        ({"optimizer.name": "lars"}, "lars applies its rate inside its momentum"),
        ({"lr_linear_scaling": True}, "drop lr_linear_scaling"),
        ({"lr_adaptation": "adamscale"}, "unknown lr_adaptation 'adamscale'"),
    ],
)
def test_refusals_are_one_line_before_compiling(overrides, says):
    devices = jax.devices()[:1] if overrides.get("mesh_shape") == (1, 1, 1) else jax.devices()
    config = adascale_config(**{"mesh_shape": (8, 1, 1), **overrides})
    with pytest.raises(ConfigError) as e:
        run_setup.setup(config, devices)
    assert says in str(e.value) and "\n" not in str(e.value)
