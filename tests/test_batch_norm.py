"""jaxpar's BatchNorm (models/batch_norm.py): flax's variables and results, its statistics in one
pass shifted by the running mean, averaged over a mesh axis in one collective."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from jaxpar.models.batch_norm import BatchNorm, local_statistics


def flax_bn(train, **kw):
    return nn.BatchNorm(use_running_average=not train, momentum=0.9, use_fast_variance=False, **kw)


def ours(train, **kw):
    return BatchNorm(use_running_average=not train, momentum=0.9, **kw)


def test_same_variables_outputs_and_running_statistics_as_flax():
    """The same variable tree (names, shapes, dtypes) as flax.linen.BatchNorm, and in training
    and evaluation the same outputs and running statistics as flax's two-pass variance."""
    x = jax.random.normal(jax.random.key(0), (16, 4, 4, 8)) * 3 + 1
    init = ours(True).init(jax.random.key(1), x)
    reference = flax_bn(True).init(jax.random.key(1), x)
    assert jax.tree.map(lambda v: (v.shape, v.dtype), init) == jax.tree.map(
        lambda v: (v.shape, v.dtype), reference
    )
    y, new = ours(True).apply(init, x, mutable=["batch_stats"])
    y_ref, new_ref = flax_bn(True).apply(reference, x, mutable=["batch_stats"])
    np.testing.assert_allclose(y, y_ref, atol=2e-6)
    for name in ("mean", "var"):
        np.testing.assert_allclose(
            new["batch_stats"][name], new_ref["batch_stats"][name], rtol=1e-6, atol=1e-7
        )
    variables = {**init, **new}
    np.testing.assert_allclose(
        ours(False).apply(variables, x),
        flax_bn(False).apply({**reference, **new_ref}, x),
        atol=2e-6,
    )


def test_the_shift_keeps_the_variance_where_the_plain_one_pass_cancels():
    """A channel whose mean (1000) is far above its spread (0.01): in float32 the plain
    E[x^2] - E[x]^2 (flax's fast variance) loses the variance entirely, while the same formula
    shifted by a running mean near the batch's recovers it to float32's precision."""
    x = 1000.0 + 0.01 * jax.random.normal(jax.random.key(0), (256, 1))
    exact = float(np.var(np.asarray(x, np.float64)))

    def batch_variance(module, mean):
        """The batch variance the module computed: its running variance's update from 0."""
        variables = module.init(jax.random.key(1), x)
        variables["batch_stats"] = {"mean": jnp.full((1,), mean), "var": jnp.zeros((1,))}
        _, stats = module.apply(variables, x, mutable=["batch_stats"])
        return float(stats["batch_stats"]["var"][0]) / (1 - 0.9)

    plain = nn.BatchNorm(use_running_average=False, momentum=0.9, use_fast_variance=True)
    assert abs(batch_variance(plain, 0.0) - exact) > exact  # off by more than the variance
    assert abs(batch_variance(ours(True), 999.99) - exact) < 1e-4 * exact  # a running mean
    assert abs(batch_variance(ours(True), 0.0) - exact) > exact  # as at the first step


def test_statistics_over_a_mesh_axis_are_the_whole_batchs():
    """Synchronised over `data` (4 devices, a quarter of the batch each): the outputs and
    running statistics of the whole batch on one device."""
    x = jax.random.normal(jax.random.key(0), (16, 4, 8)) * 2 + 0.5
    variables = ours(True).init(jax.random.key(1), x)
    mesh = Mesh(np.array(jax.devices()[:4]), ("data",))

    def step(v, x):
        return ours(True, axis_name="data").apply(v, x, mutable=["batch_stats"])

    sharded = jax.shard_map(
        step, mesh=mesh, in_specs=(P(), P("data")), out_specs=(P("data"), P()), check_vma=False
    )
    y, stats = jax.jit(sharded)(variables, x)
    y_one, stats_one = ours(True).apply(variables, x, mutable=["batch_stats"])
    np.testing.assert_allclose(y, y_one, atol=1e-6)
    for name in ("mean", "var"):
        np.testing.assert_allclose(
            stats["batch_stats"][name], stats_one["batch_stats"][name], rtol=1e-6, atol=1e-7
        )


def test_gradients_are_flaxs():
    """The gradients of a loss through BatchNorm in training, with respect to the input, the
    scale and the bias, are those of flax's two-pass BatchNorm."""
    x = jax.random.normal(jax.random.key(0), (16, 4, 4, 8)) * 3 + 1
    w = jax.random.normal(jax.random.key(2), x.shape)
    variables = ours(True).init(jax.random.key(1), x)
    variables["batch_stats"]["mean"] = jnp.full((8,), 0.7)  # a shift that is not zero

    def loss(module, params, x):
        y, _ = module.apply(
            {"params": params, "batch_stats": variables["batch_stats"]}, x, mutable=["batch_stats"]
        )
        return jnp.sum(jnp.sin(y) * w)

    got = jax.grad(functools.partial(loss, ours(True)), argnums=(0, 1))(variables["params"], x)
    ref = jax.grad(functools.partial(loss, flax_bn(True)), argnums=(0, 1))(variables["params"], x)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_thelocal_statistics_gradient_is_autodiffs_without_the_shift():
    """local_statistics' own backward (which reads the batch mean, not the shift)
    gives JAX's gradient of the same statistics, to float64's rounding."""

    def plain(x, shift):
        centred = x - jax.lax.stop_gradient(shift)
        m1, m2 = centred.mean((0, 1, 2)), jnp.square(centred).mean((0, 1, 2))
        return shift + m1, jnp.maximum(0.0, m2 - jnp.square(m1))

    with jax.enable_x64(True):
        x = jax.random.normal(jax.random.key(0), (16, 4, 4, 8), jnp.float64) * 3 + 1
        shift = jnp.linspace(-1.0, 2.0, 8, dtype=jnp.float64)
        d_mean, d_var = jnp.linspace(0.5, 1.5, 8), jnp.linspace(-2.0, 1.0, 8)

        def loss(fn, x):
            mean, var = fn(x, shift)
            return jnp.sum(mean * d_mean + var * d_var)

        got = jax.grad(functools.partial(loss, local_statistics))(x)
        ref = jax.grad(functools.partial(loss, plain))(x)
        assert np.max(np.abs(got - ref)) < 1e-12 * np.max(np.abs(ref))
        np.testing.assert_array_equal(
            np.asarray(local_statistics(x, shift)), np.asarray(plain(x, shift))
        )
