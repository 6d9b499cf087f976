"""Synchronisation modes: each equals its own hand-written reference, and its compiled step
communicates what the mode says it does."""

import functools
import json
import math
import os
import shutil
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxpar import analysis, hlo, parallel, run_setup, trainer
from jaxpar.config import ConfigError
from jaxpar.parallel.state import forward_loss, init_state
from jaxpar.parallel.sync import async_sgd, traffic
from tests.util import max_rel_error, reference_run, run_steps, tiny_config

RTOL = 1e-5
N = 4


def sync_config(mode, **overrides):
    return tiny_config(**{"sync.mode": mode, "mesh_shape": (N, 1, 1), **overrides})


def replicas(tree, r):
    return jax.tree.map(lambda x: x[r], tree)


def hand_written(config, steps, rule, n=N):
    """n replicas trained plainly (jit(grad) per replica share, optax), combined by `rule`:
    rule(t, states, grads) -> states. Returns (per-step mean losses, states)."""
    config = config.copy_and_resolve_references()
    config.mesh_shape = (1, 1, 1)
    config.sync.mode = "allreduce"
    setup = run_setup.setup(config, jax.devices()[:1])
    tx = setup.strategy.tx
    grad_fn = jax.jit(
        jax.value_and_grad(functools.partial(forward_loss, setup.model), has_aux=True)
    )
    state = init_state(setup.model, tx, jax.random.key(config.seed))
    states = [state] * n
    losses = []
    for t in range(steps):
        batch = run_setup.local_train_batch(setup, t)
        share = len(batch["label"]) // n
        grads, step_losses = [], []
        for r in range(n):
            part = {k: v[r * share : (r + 1) * share] for k, v in batch.items()}
            (loss, (stats, _)), g = grad_fn(states[r].params, states[r].batch_stats, part)
            states[r] = states[r].replace(batch_stats=stats)
            grads.append(g)
            step_losses.append(float(loss))
        states = rule(t, states, grads, tx)
        losses.append(np.mean(step_losses))
    return np.array(losses), states


def apply(tx, state, grads):
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    return state.replace(
        step=state.step + 1, params=optax.apply_updates(state.params, updates), opt_state=opt_state
    )


def mean_tree(trees):
    return jax.tree.map(lambda *xs: sum(xs[1:], xs[0]) / len(xs), *trees)


@pytest.fixture(scope="module")
def references():
    """SGD with momentum: the single-device program. Adam: allreduce on the same N devices."""
    return {
        "sgd": reference_run(tiny_config(), steps=4),
        "adam": run_steps(sync_config("allreduce", **{"optimizer.name": "adam"}), N, steps=4),
    }


# Adam divides each coordinate by its own gradient scale, so where replicas' gradients nearly
# cancel, float rounding in the order of summation grows into a visible difference of the step:
# after 4 steps allreduce itself differs from the single-device program by more than 1e-5.
# Parameters under Adam are therefore held to allreduce at 5e-4, with room for CPUs whose
# kernels sum in another order (lower it and run this file to see the differences). The
# moments (opt_state) are held to it too: a gradient N times too large shows there at once.
# Losses and SGD at 1e-5.
PARAM_RTOL = {"sgd": RTOL, "adam": 5e-4}


@pytest.mark.parametrize("opt", ["sgd", "adam"])
@pytest.mark.parametrize("mode", ["parameter_server", "sharded"])
def test_server_and_sharded_equal_allreduce(references, mode, opt):
    ref_losses, ref_state = references[opt]
    losses, state = run_steps(sync_config(mode, **{"optimizer.name": opt}), N, steps=4)
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL)
    assert max_rel_error(state.params, ref_state.params) < PARAM_RTOL[opt]
    assert max_rel_error(state.opt_state, ref_state.opt_state) < PARAM_RTOL[opt]  # canonical
    assert np.ptp(ref_losses) > 1e-3


def test_local_sgd_period_one_plain_sgd_is_allreduce():
    plain = {"optimizer.momentum": 0.0}
    ref_losses, ref_state = reference_run(tiny_config(**plain))
    losses, state = run_steps(sync_config("local_sgd", **{"sync.period": 1, **plain}), N)
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL)
    for r in range(N):
        assert max_rel_error(replicas(state.params, r), ref_state.params) < RTOL


def local_sgd_by_hand(t, states, grads, tx, period=2):
    """Each replica its own step; parameters averaged after every `period` steps."""
    states = [apply(tx, s, g) for s, g in zip(states, grads)]
    if (t + 1) % period == 0:
        avg = mean_tree([s.params for s in states])
        states = [s.replace(params=avg) for s in states]
    return states


def test_local_sgd_averages_every_period():
    """Momentum kept local, parameters averaged after steps 2 and 4: equal to replicas trained
    apart and averaged by hand; between averages the replicas differ."""
    config = sync_config("local_sgd", **{"sync.period": 2})
    ref_losses, ref_states = hand_written(config, 3, local_sgd_by_hand)
    losses, state = run_steps(config, N, steps=3)
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL)
    for r in range(N):
        assert max_rel_error(replicas(state.params, r), ref_states[r].params) < RTOL
        assert max_rel_error(replicas(state.opt_state, r), ref_states[r].opt_state) < RTOL
    spread = max_rel_error(replicas(state.params, 1), replicas(state.params, 0))
    assert spread > 1e-3  # step 3 is local: the replicas have drifted apart again


@pytest.mark.parametrize("aware", [False, True], ids=["plain", "staleness_aware"])
def test_async_applies_each_gradient_at_its_delay(aware):
    staleness = 2
    delays = async_sgd.delays(N, staleness)
    assert delays == [0, 1, 1, 2] and max(delays) == staleness
    config = sync_config(
        "async", **{"sync.max_staleness": staleness, "sync.staleness_aware_lr": aware}
    )
    history = []

    def rule(t, states, grads, tx):
        history.append(grads)
        arriving = []
        for r, d in enumerate(delays):
            g = history[t - d][r] if t >= d else jax.tree.map(jnp.zeros_like, grads[r])
            scale = 1.0 / max(d, 1) if aware else 1.0
            arriving.append(jax.tree.map(lambda x, scale=scale: x * scale, g))
        shared = apply(tx, states[0], mean_tree(arriving))
        return [shared] * N

    ref_losses, ref_states = hand_written(config, 4, rule)
    losses, state = run_steps(config, N, steps=4)
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL)
    assert max_rel_error(state.params, ref_states[0].params) < RTOL
    # The pending queues hold the last two gradients of every replica, in order. A gradient is
    # not held to 1e-5 here: the 1e-7 parameter differences can flip a max-pool's choice between
    # near-equal inputs, which changes every earlier layer's gradient by ~1e-2 (seen on one CPU
    # for one replica's newest gradient). The right gradient is within 5e-2; the other slot's,
    # a step apart, is ~1 away; the parameters above are held to 1e-5 all the same.
    for r in range(N):
        for k in range(staleness):
            got = replicas(replicas(state.sync["pending"], r), k)
            assert max_rel_error(got, history[3 - k][r]) < 5e-2
            assert max_rel_error(got, history[3 - (1 - k)][r]) > 0.2


def test_async_staleness_zero_is_allreduce(references):
    ref_losses, ref_state = references["sgd"]
    losses, state = run_steps(sync_config("async", **{"sync.max_staleness": 0}), N, steps=4)
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL)
    assert max_rel_error(state.params, ref_state.params) < RTOL
    assert state.sync == {}


def test_independent_replicas_diverge():
    _, state = run_steps(sync_config("independent"), N)
    assert max_rel_error(replicas(state.params, 1), replicas(state.params, 0)) > 1e-3


def compiled(config):
    setup = run_setup.setup(config, jax.devices()[:N])
    state = setup.strategy.init_state(jax.random.key(0))
    batch = setup.strategy.put_batch(run_setup.local_train_batch(setup, 0))
    (step,) = analysis.programs(setup.strategy, config.global_batch_size)
    text = step.compiled.as_text()
    return text, hlo.collectives(text), 4 * setup.model.num_params, setup, state, batch


def test_parameter_server_fan_in():
    text, found, param_bytes, *_ = compiled(sync_config("parameter_server", **{"sync.server": 1}))
    sent, received = traffic.permute_bytes(text, N)
    # The server receives and sends (N-1) x the parameters; each worker 1 x.
    assert received[1] == sent[1] == (N - 1) * param_bytes
    for worker in (0, 2, 3):
        assert received[worker] == sent[worker] == param_bytes
    big = [c for c in found if c.kind != "collective-permute" and c.bytes > 64]
    assert not big, big  # no all-reduce of the gradients besides


def test_sharded_reduce_scatter_and_all_gather():
    """Per parameter split over the replicas: a reduce-scatter of its gradient (1/N of it
    received) and an all-gather of its slices; the few that do not divide are all-reduced.
    Adam's two moments: 1/N per device of the split parameters."""
    _, found, param_bytes, setup, state, _ = compiled(
        sync_config("sharded", **{"optimizer.name": "adam"})
    )
    params = setup.strategy.canonical_shapes().params
    dims = setup.strategy.rule.split_dims(params)
    sizes = jax.tree.leaves(
        jax.tree.map(lambda p, d: (4 * p.size, d), params, dims),
        is_leaf=lambda x: isinstance(x, tuple),
    )
    split = sum(n for n, d in sizes if d is not None)
    assert split > 0.99 * param_bytes  # every conv's input channels divide by 4
    total = lambda kind: sum(c.bytes for c in found if c.kind == kind)
    assert total("reduce-scatter") == split // N and total("all-gather") == split
    assert total("all-reduce") <= param_bytes - split + 64  # the rest, and scalar metrics
    opt = sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(state.opt_state))
    assert opt <= 2 * (split // N + param_bytes - split) + 64


def test_local_sgd_once_a_period_independent_never_async_once():
    text, found, param_bytes, *_ = compiled(sync_config("local_sgd", **{"sync.period": 4}))
    assert [c.kind for c in found] == ["all-reduce"] and found[0].bytes == param_bytes
    assert traffic.conditional_collectives(text) == 1  # inside the every-period branch
    _, found, *_ = compiled(sync_config("independent"))
    assert found == []
    _, found, param_bytes, *_ = compiled(sync_config("async", **{"sync.max_staleness": 2}))
    assert [c.kind for c in found] == ["all-reduce"] * len(found)
    big = [c.bytes for c in found if c.bytes > 64]  # XLA may fuse the two scalar metrics in
    assert len(big) == 1 and param_bytes <= big[0] <= param_bytes + 8


def test_local_sgd_average_is_listed_once_a_period():
    """The report and --explain count local_sgd's average at its per-step average (P/period)
    and say it runs once every `period` steps."""
    from jaxpar import explain

    config = sync_config("local_sgd", **{"sync.period": 4})
    setup = run_setup.setup(config, jax.devices()[:N])
    fig = analysis.report(setup.strategy, config.global_batch_size, timing=False)
    (row,) = [r for r in fig["collectives"] if r[2] == "data"]
    assert row[5] == 4 and row[4] * 4 == 4 * setup.model.num_params  # every 4 steps; per-step avg
    assert fig["collective_bytes_per_device"] == row[4]
    text = explain.explain(config, jax.devices()[:N])
    line = next(x for x in text.splitlines() if x.startswith("  step     all-reduce"))
    assert f"{4 * setup.model.num_params // 4:,}" in line
    assert f"once every 4 steps: {4 * setup.model.num_params:,} bytes each time" in line
    assert "data parallel over 4 (local_sgd)" in text


def test_refusals_are_one_line():
    cases = [
        (
            {"sync.mode": "independent", "mesh_shape": (2, 4, 1), "sync.batch_norm": "local"},
            r"cannot combine with pipeline stages \(every replica evaluates",
        ),
        ({"sync.mode": "local_sgd", "sync.impl": "pmap"}, "runs with sync.impl=shard_map"),
        ({"sync.mode": "local_sgd", "model.batch_norm": True}, "sync.batch_norm=local"),
        ({"sync.mode": "parameter_server", "sync.server": 8}, "not a device of the data axis"),
        ({"sync.mode": "gossip"}, "unknown sync.mode"),
    ]
    for overrides, message in cases:
        with pytest.raises(ConfigError, match=message) as info:
            run_setup.setup(tiny_config(**overrides), jax.devices())
        assert "\n" not in str(info.value)


def train_losses(workdir) -> list[float]:
    with open(workdir / "metrics.jsonl") as f:
        records = [json.loads(line) for line in f]
    return [r["loss"] for r in records if r["split"] == "train"]


@pytest.mark.parametrize(
    "mode,overrides",
    [("local_sgd", {"sync.period": 4}), ("async", {"sync.max_staleness": 2})],
    ids=["local_sgd_mid_period", "async_gradients_pending"],
)
def test_resume_is_bit_exact(tmp_path, capsys, mode, overrides):
    """Stop after step 3 (local_sgd: 3 steps into a period of 4; async: gradients of steps
    2 and 3 still pending), resume, and get the uninterrupted run's losses and state."""
    config = sync_config(mode, **overrides, num_train_steps=6, checkpoint_every_steps=3)
    devices = jax.devices()[:N]
    ref = trainer.train_and_evaluate(config, str(tmp_path / "ref"), devices)
    resumed = tmp_path / "resumed"
    trainer.train_and_evaluate(config, str(resumed), devices)
    shutil.rmtree(resumed / "checkpoints" / "6")  # as if stopped after step 3
    capsys.readouterr()
    again = trainer.train_and_evaluate(config, str(resumed), devices)
    assert "resumed from the checkpoint of step 3" in capsys.readouterr().out
    assert again.summary.steps == 6
    assert train_losses(resumed) == train_losses(tmp_path / "ref")
    jax.tree.map(np.testing.assert_array_equal, again.state, ref.state)
    if mode == "async":
        assert max(float(np.abs(x).max()) for x in jax.tree.leaves(ref.state.sync)) > 0


CLI = [
    sys.executable,
    "-u",
    "-m",
    "jaxpar.train",
    "--config",
    "configs/vgg19_sync.py",
    "--config.model.name=vgg11",
    "--config.model.width=0.0625",
    "--config.model.batch_norm=False",
    "--config.global_batch_size=16",
    "--config.num_train_steps=10",
    "--config.log_every_steps=1",
    "--config.eval_every_steps=0",
    "--config.data.name=synthetic",
    "--config.data.num_train=64",
    "--config.data.num_eval=16",
    "--config.checkpoint_every_steps=4",
    "--config.sync.mode=async",
    "--config.sync.max_staleness=3",
    "--config.sync.staleness_aware_lr=True",
]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_cli_sigterm_with_gradients_pending_resumes_exactly(tmp_path):
    """The CLI stopped by SIGTERM at step 3 (async, 8 replicas with delays 0..3) saves the
    pending gradients with the model; rerunning finishes with the uninterrupted run's losses."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    run = lambda workdir: subprocess.Popen(
        [*CLI, "--workdir", str(workdir)],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    ref = run(tmp_path / "ref")
    assert ref.wait(timeout=600) == 0, ref.stdout.read()[-2000:]
    proc = run(tmp_path / "termed")
    for line in proc.stdout:
        if line.startswith("step  3/10"):
            proc.send_signal(signal.SIGTERM)
            break
    out = proc.stdout.read()
    assert proc.wait(timeout=300) == 0 and "SIGTERM: saved the checkpoint of step" in out
    proc = run(tmp_path / "termed")
    out = proc.stdout.read()
    assert proc.wait(timeout=600) == 0 and "resumed from the checkpoint of step" in out
    assert "resumed from the checkpoint of step 10" not in out  # it stopped before the end
    assert train_losses(tmp_path / "termed") == train_losses(tmp_path / "ref")


def test_example_config_and_study_suite_validate():
    """configs/vgg19_sync.py does what its docstring says: every command of its "Run:" block is
    a run of 8 data replicas (the file loads, every --config key exists, the mesh validates on
    8 devices), the plain one local SGD averaging every 4 steps, the second async with
    staleness 4, staleness-aware; and every row of the sync study validates on 4 devices."""
    import shlex

    from configs import vgg19_sync
    from configs.bench import sync as suite_file
    from jaxpar import configfile
    from tests.util import ROOT, override

    block = vgg19_sync.__doc__.split("Run:", 1)[1].split("\n\n", 1)[0].replace("\\\n", " ")
    commands = [shlex.split(line, comments=True) for line in block.splitlines()]
    configs = []
    for argv in commands:
        assert argv[:4] == ["python", "-m", "jaxpar.train", "--config"], argv
        config = configfile.load(os.path.join(ROOT, argv[4]))
        settings, rest = configfile.split_overrides(argv[5:])
        configfile.override(config, settings)  # KeyError: a key the config does not have
        assert rest in ([], ["--explain"]), rest
        assert list(parallel.validate(config, 8).items()) == [
            ("data", 8),
            ("stage", 1),
            ("tensor", 1),
        ]
        configs.append(config)
    assert len(configs) == 3
    plain, stale, _ = configs  # the third: the first with --explain
    assert (plain.sync.mode, plain.sync.period) == ("local_sgd", 4)
    sync = stale.sync
    assert (sync.mode, sync.max_staleness, sync.staleness_aware_lr) == ("async", 4, True)
    suite = suite_file.get_config()
    for row in suite.rows:
        config = override(vgg19_sync.get_config(), dict(suite.overrides))
        config = override(config, dict(row["config"]))
        assert tuple(parallel.validate(config, 4).values()) == (4, 1, 1)


# Hybrid meshes: every stage's and every tensor shard's data replicas follow the rule. The
# pipelines run 2 micro-batches (BatchNorm off: the same function as one).
HYBRID = {"pipeline.schedule": "1f1b", "pipeline.num_microbatches": 2}


@pytest.mark.parametrize("mesh", [(2, 2, 2), (4, 2, 1)], ids=["2x2x2", "4x2x1"])
def test_sharded_on_hybrid_meshes_is_the_single_device_step(mesh):
    config = sync_config("sharded", **HYBRID, mesh_shape=mesh)
    ref_losses, ref_state = reference_run(tiny_config(), steps=3)
    losses, state = run_steps(config, 8, steps=3)
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL)
    assert max_rel_error(state.params, ref_state.params) < RTOL
    assert max_rel_error(state.opt_state, ref_state.opt_state) < RTOL


@pytest.mark.parametrize("mesh", [(2, 2, 2), (4, 2, 1)], ids=["2x2x2", "4x2x1"])
def test_local_sgd_on_hybrid_meshes_is_the_hand_written_rule(mesh):
    config = sync_config("local_sgd", **HYBRID, mesh_shape=mesh, **{"sync.period": 2})
    n = mesh[0]
    ref_losses, ref_states = hand_written(config, 3, local_sgd_by_hand, n=n)
    losses, state = run_steps(config, 8, steps=3)
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL)
    for r in range(n):
        assert max_rel_error(replicas(state.params, r), ref_states[r].params) < RTOL
        assert max_rel_error(replicas(state.opt_state, r), ref_states[r].opt_state) < RTOL


@pytest.mark.parametrize(
    "mode,mesh,overrides",
    [
        ("parameter_server", (2, 2, 2), {"sync.server": 1}),
        ("async", (2, 2, 2), {}),
        ("independent", (2, 1, 2), {"sync.batch_norm": "local"}),
    ],
    ids=["parameter_server-2x2x2", "async-2x2x2", "independent-2x1x2"],
)
def test_other_modes_on_hybrid_meshes_equal_data_parallel(mode, mesh, overrides):
    """The same rule over the same 2 replicas, with stages and a tensor axis or without."""
    data_only = sync_config(mode, **overrides, mesh_shape=(2, 1, 1))
    ref_losses, ref_state = run_steps(data_only, 2, steps=3)
    losses, state = run_steps(
        sync_config(mode, **overrides, **HYBRID, mesh_shape=mesh), math.prod(mesh), steps=3
    )
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL)
    for a, b in ((state.params, ref_state.params), (state.sync, ref_state.sync)):
        assert max_rel_error(a, b) < RTOL
