"""Shared test helpers: tiny configs, a driver that runs real training steps, and the command
line run in subprocesses (one process, or several joined as a cluster)."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import re
import socket
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import base
from jaxpar import axes, configfile, run_setup
from jaxpar import mesh as mesh_lib
from jaxpar.bench.row_record import BenchRow
from jaxpar.parallel.state import forward_loss, host_init_state
from jaxpar.summary_record import (
    LearningRate,
    NoiseScaleFigures,
    RunSummary,
    TargetFigures,
    TargetReached,
)


def tiny_config(**overrides):
    """A VGG small enough for 2 CPU cores, on synthetic 32x32 data."""
    config = base.get_config()
    config.model.name = "vgg11"
    config.model.width = 1 / 16  # channels 4 .. 32
    config.model.batch_norm = False
    config.global_batch_size = 16
    config.num_train_steps = 3
    config.learning_rate = 0.05
    config.warmup_steps = 0
    config.lr_schedule = "constant"
    config.data.name = "synthetic"
    config.data.image_shape = (32, 32, 3)
    config.data.num_train = 64
    config.data.num_eval = 20
    config.log_every_steps = 1
    config.eval_every_steps = 0
    return override(config, overrides)


def bench_row(**fields) -> BenchRow:
    """A bench results row with these fields, every other one as a row that lacks it has it
    (None; name and group empty)."""
    return BenchRow(**fields)


def tiny_profile(**kw):
    """A hardware profile of 8 devices in one node at 1 TFLOP/s and half of it reached, 10 GB/s
    between them and 1 GB/s between nodes, no latency: `kw` replaces any of its fields."""
    from jaxpar.predict.profiles import hardware

    base = {
        "name": "test",
        "num_devices": 8,
        "devices_per_node": 8,
        "peak_flops": {"float32": 1e12},
        "memory_bytes": 16e9,
        "intra": hardware.Link(10e9, 0.0),
        "inter": hardware.Link(1e9, 0.0),
        "compute_efficiency": 0.5,
    }
    return hardware.build(**{**base, **kw})


def override(config, overrides: dict):
    """Set dotted keys ("model.width") on a ConfigDict, as --config.KEY=VALUE would (a test may
    add a key the config lacks)."""
    return configfile.override(config, overrides, new_keys=True)


def run_steps(config, num_devices: int, steps: int | None = None):
    """Run `steps` real training steps on the first `num_devices` devices.

    Returns (losses per step, canonical final state) on the host.
    """
    setup = run_setup.setup(config, jax.devices()[:num_devices])
    state = setup.strategy.init_state(jax.random.key(config.seed))
    losses = []
    for i in range(steps or config.num_train_steps):
        batch = setup.strategy.put_batch(run_setup.local_train_batch(setup, i))
        state, metrics = setup.strategy.train_step(state, batch)
        losses.append(float(metrics["loss"]))
    return np.array(losses), jax.device_get(setup.strategy.canonical(state))


def reference_run(config, steps: int | None = None, microbatches: int = 1):
    """The single-device program, written plainly: jit(grad + optax) with no mesh at all.

    Every partitioning is held to this. With `microbatches` > 1 it is the documented
    micro-batching policy: the batch is split in M equal parts, each normalised with its own
    BatchNorm statistics and updating the running averages in order; the step's loss and
    gradient are the means over the parts, applied once. Part m holds the m-th 1/M of every
    data replica's share of the batch (the product of the mesh's batch axes; with one replica, the
    m-th 1/M of the batch), as a pipeline's micro-batch does.
    Returns (losses per step, final state) on the host.
    """
    names = mesh_lib.axis_names(config)
    shape = dict(zip(names, config.mesh_shape, strict=True))
    replicas = math.prod(max(int(shape[a]), 1) for a in axes.batch_axes(shape))
    config = config.copy_and_resolve_references()
    config.mesh_shape = (1,) * len(names)
    setup = run_setup.setup(config, jax.devices()[:1])
    steps = steps if steps is not None else config.num_train_steps
    key = (
        config.to_json_best_effort(sort_keys=True),
        steps,
        replicas,
        microbatches,
        jax.config.jax_enable_x64,
        tuple((layer.name, layer.in_shape, repr(layer.module)) for layer in setup.model.layers),
    )
    if key not in _REFERENCES:
        _REFERENCES[key] = _run_reference(setup, steps, replicas, microbatches)
    losses, state = _REFERENCES[key]
    return losses.copy(), state


# reference_run's runs in this process, by everything they depend on: tests of one file that
# hold different partitionings of one config to one device share its run. The model's layers
# are in the key, so a test that patches a model's depth gets its own.
_REFERENCES: dict[tuple, tuple] = {}


def _run_reference(setup, steps: int, replicas: int, microbatches: int):
    """reference_run's program and steps."""
    config, model, tx = setup.config, setup.model, setup.strategy.tx
    # the initial state every strategy places (one jitted program per model: eager
    # initialisers round some parameters 1 ulp differently, which a chaotic model, ResNet-50
    # at width 1/16, grows to 1e-2 in 3 steps)
    state = host_init_state(model, tx, jax.random.key(config.seed))

    @jax.jit
    def step(state, batch):
        grad_fn = jax.value_and_grad(functools.partial(forward_loss, model), has_aux=True)
        stats, loss, grads = state.batch_stats, 0.0, None
        for part in range(microbatches):
            size = len(batch["label"]) // microbatches
            mb = jax.tree.map(
                lambda v, part=part, size=size: v[part * size : (part + 1) * size], batch
            )
            (mb_loss, (stats, _)), mb_grads = grad_fn(state.params, stats, mb)
            loss = loss + mb_loss / microbatches
            scaled = jax.tree.map(lambda g: g / microbatches, mb_grads)
            grads = scaled if grads is None else jax.tree.map(jnp.add, grads, scaled)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        new = state.replace(
            step=state.step + 1, params=params, batch_stats=stats, opt_state=opt_state
        )
        return new, loss

    def grouped(v):  # replica r's rows, micro-batch by micro-batch
        parts = np.reshape(v, (replicas, microbatches, -1, *v.shape[1:])).swapaxes(0, 1)
        return np.reshape(parts, v.shape)

    losses = []
    for i in range(steps):
        batch = jax.tree.map(grouped, run_setup.local_train_batch(setup, i))
        state, loss = step(state, batch)
        losses.append(float(loss))
    return np.array(losses), jax.device_get(state)


def max_rel_error(got, ref, floor: float = 1e-3) -> float:
    """Largest leaf-wise max|got - ref| / max(max|ref|, floor) over two pytrees.

    The floor keeps leaves that are pure rounding noise from dividing by ~0: a conv bias
    followed by BatchNorm has a gradient of exactly zero in exact arithmetic, so it stays at
    ~1e-9 and its "relative" error means nothing. Real parameters are far above the floor.
    """
    errors = jax.tree.map(
        lambda a, b: (
            float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
            / max(float(np.max(np.abs(np.asarray(b)))), floor)
        ),
        got,
        ref,
    )
    return max(jax.tree.leaves(errors), default=0.0)


def run_and_evaluate(config, num_devices: int, steps: int, evaluate_at=()):
    """`run_steps`, and the whole eval split evaluated (run_setup.evaluate) after each step in
    `evaluate_at`, as a training run evaluates it. Returns (losses per step, canonical final
    state, [evaluation dict per step in evaluate_at]) on the host."""
    setup = run_setup.setup(config, jax.devices()[:num_devices])
    state = setup.strategy.init_state(jax.random.key(config.seed))
    losses, evaluations = [], []
    for i in range(steps):
        batch = setup.strategy.put_batch(run_setup.local_train_batch(setup, i))
        state, metrics = setup.strategy.train_step(state, batch)
        losses.append(float(metrics["loss"]))
        if i + 1 in evaluate_at:
            evaluations.append(run_setup.evaluate(setup, state))
    return np.array(losses), jax.device_get(setup.strategy.canonical(state)), evaluations


# -- the command line, in subprocesses ---------------------------------------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# tiny_config() as command-line settings of configs/base.py
TINY = {
    "model.name": "vgg11",
    "model.width": 0.0625,
    "model.batch_norm": False,
    "global_batch_size": 16,
    "learning_rate": 0.05,
    "warmup_steps": 0,
    "lr_schedule": "constant",
    "data.name": "synthetic",
    "data.num_train": 64,
    "data.num_eval": 20,
    "log_every_steps": 1,
    "eval_every_steps": 0,
}


def flag(key: str, value) -> str:
    """--config.KEY=VALUE as a user types it (tuples without spaces)."""
    text = str(tuple(value)).replace(" ", "") if isinstance(value, (tuple, list)) else value
    return f"--config.{key}={text}"


def flags(settings: dict) -> list[str]:
    return [flag(k, v) for k, v in settings.items()]


# A short run of a shipped config on its own data (configs/vgg19_data.py: BatchNorm, shapes10)
# at a small width: 6 steps, logged every 2, evaluated at steps 3 and 6.
SHORT_RUN = flags(
    {
        "num_train_steps": 6,
        "model.name": "vgg11",
        "model.width": 0.0625,
        "global_batch_size": 16,
        "log_every_steps": 2,
        "eval_every_steps": 3,
        "warmup_steps": 1,
        "data.num_train": 256,
        "data.num_eval": 40,
    }
)


def cli_env(extra: dict | None = None) -> dict:
    return {**os.environ, "PYTHONPATH": ROOT, **(extra or {})}


# What tests/conftest.py adds to XLA_FLAGS to compile faster, which changes the compiled
# programs a prediction reads (a few per cent on a fitted cost)
FAST_COMPILE_FLAG = "--xla_cpu_use_fusion_emitters=false"


def default_compiler_env() -> dict:
    """cli_env() with XLA:CPU's default fusion emitters: what `python -m jaxpar.predict` reads."""
    env = cli_env()
    env["XLA_FLAGS"] = env.get("XLA_FLAGS", "").replace(FAST_COMPILE_FLAG, "")
    return env


def run_cli(*args, cwd=ROOT, env=None, timeout=600) -> subprocess.CompletedProcess:
    """`python -m jaxpar.train ARGS` to its end; output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "jaxpar.train", *args],
        cwd=cwd,
        env=cli_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_cli(*args, env=None, log=None, stderr=subprocess.STDOUT, module="jaxpar.train"):
    """`python -u -m MODULE ARGS` (jaxpar.train by default) in the background. Its output goes
    to the file `log` (appended), else to a text pipe; stderr joins stdout unless `stderr`
    says otherwise (subprocess.PIPE: a pipe of its own)."""
    out = open(log, "a") if log else subprocess.PIPE
    return subprocess.Popen(
        [sys.executable, "-u", "-m", module, *args],
        cwd=ROOT,
        env=cli_env(env),
        stdout=out,
        stderr=stderr,
        text=True,
    )


def MULTIPROCESS(test):
    """Every launch of several processes: in the multiprocess set, and slow."""
    return pytest.mark.slow(pytest.mark.multiprocess(test))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at `host` now (a loopback address)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def start_processes(workdir, args, env=None, module="jaxpar.train", num=2, devices=4) -> list:
    """The `num` processes of one run with `devices` simulated CPU devices each, started as a
    cluster starts them (--coordinator/--num_processes/--process_id over loopback, without
    launch/local.py's help), with this process's other XLA_FLAGS. Process i writes its output
    to WORKDIR.proc{i}.log."""
    port = free_port()
    xla = configfile.with_host_devices(devices)
    env = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": xla, **(env or {})}
    joined = [f"--coordinator=127.0.0.1:{port}", f"--num_processes={num}"]
    return [
        start_cli(
            *args,
            *joined,
            f"--process_id={i}",
            env=env,
            log=f"{workdir}.proc{i}.log",
            module=module,
        )
        for i in range(num)
    ]


def wait_all(procs, timeout=300) -> list[int]:
    """Every process's exit status; all are killed if any is still running at `timeout`."""
    deadline = time.monotonic() + timeout
    try:
        return [p.wait(timeout=max(deadline - time.monotonic(), 1)) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


STEP_LINE = re.compile(r"^(?:\[\d+\] )?step +(\d+)/")


def wait_for_step(proc, step: int) -> str:
    """Read `proc`'s output pipe until a progress line of `step` or later; returns what it
    read."""
    read = []
    for line in proc.stdout:
        read.append(line)
        match = STEP_LINE.match(line)
        if match and int(match.group(1)) >= step:
            return "".join(read)
    rest = proc.stderr.read() if proc.stderr else "".join(read)
    raise AssertionError(f"the run ended before step {step}: {rest[-2000:]}")


def wait_in_log(path, pattern: str, procs, timeout=240, after: str = "") -> None:
    """Poll the file `path` until `pattern` (a regex, multi-line) occurs after the last
    occurrence of `after`; fails if any of `procs` ends first or at `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        text = open(path).read()
        if re.search(pattern, text[text.rfind(after) if after else 0 :], re.MULTILINE):
            return
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), text[-3000:]
        time.sleep(0.2)


# What JAX's CUDA plugin (requirements-gpu-compile.txt) writes from C++ as it loads on a machine
# without a GPU driver, before any of jaxpar runs: not jaxpar's output.
PLUGIN_NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog|I\d{4} .*cudart_stub)"
)


def one_error_line(proc, status: int = 2) -> str:
    """The run failed with `status` and printed exactly one line on stderr (the CUDA plugin's
    start-up lines aside), no traceback."""
    assert proc.returncode == status, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not PLUGIN_NOISE.match(ln)]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    return lines[0]


def records(workdir, split: str | None = None) -> list[dict]:
    """WORKDIR/metrics.jsonl, of one split if given."""
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [r for r in rows if split is None or r["split"] == split]


def train_losses(workdir) -> list[float]:
    return [r["loss"] for r in records(workdir, "train")]


def reached_summary(steps: int, batch: int = 64, **changes) -> RunSummary:
    """The summary of a run that reached accuracy 0.9 after `steps` steps of `batch` and
    measured its noise scale (50 throughout), as the trainer writes it; `changes` replace
    its fields."""
    summary = RunSummary(
        strategy="data",
        partitioning="data parallel over 8",
        num_devices=8,
        mesh_shape=(8, 1, 1),
        mesh_axes=axes.DEFAULT,
        mesh="(data=8, stage=1, tensor=1)",
        steps=steps,
        global_batch_size=batch,
        compile_time_s=2.0,
        wall_time_s=30.0,
        final_loss=0.5,
        eval_loss=0.4,
        eval_accuracy=0.91,
        num_params=1000,
        model_flops_per_image=3e6,
        target=TargetFigures(
            target="eval accuracy >= 0.9",
            target_reached=True,
            eval_time_s=1.5,
            evaluations=steps,
            target_accuracy=0.9,
            reached=TargetReached(steps, steps * batch, 20.0, 0.91, 0.4),
        ),
        rate=LearningRate("noise", "none", 0.1, 16, "allreduce"),
        noise=NoiseScaleFigures(50.0, 50.0, batch / 8, batch, steps, 50.0, to_target=True),
    )
    return dataclasses.replace(summary, **changes)
