"""Does the training loop cost anything over a bare, hand-written shard_map step?

Run:  python benchmarks/loop_overhead.py [--steps 40] [--repeats 3] [--width 0.25] [--batch 128]

Both sides run the same model, mesh, optimizer and batch size on all devices (8 simulated CPU
devices unless XLA_FLAGS says otherwise). "bare" is a jitted shard_map step written out here
(forward, grad, one pmean, optax update) called in a tight Python loop on one pre-placed batch,
timed over the whole run. "loop" is jaxpar.trainer.train_and_evaluate (loader, prefetch thread,
metrics, logging) and its summary images/sec. Runs alternate bare/loop to share the machine's
noise; the figure is the ratio of medians (>= 0.95 is the target).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jaxpar import configfile, log

configfile.set_host_device_count(8)  # unless XLA_FLAGS already says

import datafile
import jax
import optax
from jax import lax
from jax.sharding import PartitionSpec as P

from configs import base
from jaxpar import run_setup, run_summary, trainer
from jaxpar.parallel.state import cross_entropy


def make_config(args):
    config = base.get_config()
    config.model.name = args.model
    config.model.width = args.width
    config.model.batch_norm = False
    config.model.dtype = args.dtype
    config.global_batch_size = args.batch
    config.num_train_steps = args.steps
    config.log_every_steps = args.steps
    config.eval_every_steps = 0
    config.data.name = "synthetic"
    config.data.num_eval = args.batch  # the loop's final eval: one batch
    return config


def bare_images_per_sec(config, steps: int) -> float:
    setup = run_setup.setup(config)
    model, tx, mesh = setup.model, setup.strategy.tx, setup.mesh

    def step(params, opt_state, batch):
        def loss_fn(p):
            logits, _ = model.apply(p, {}, batch["image"], train=True)
            return cross_entropy(logits, batch["label"])

        local = lax.pcast(params, "data", to="varying")
        loss, grads = jax.value_and_grad(loss_fn)(local)
        grads = lax.pmean(grads, "data")
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, lax.pmean(loss, "data")

    fn = jax.jit(
        jax.shard_map(step, mesh=mesh, in_specs=(P(), P(), P("data")), out_specs=(P(), P(), P())),
        donate_argnums=(0, 1),
    )
    state = setup.strategy.init_state(jax.random.key(0))
    params, opt_state = state.params, state.opt_state
    batch = setup.strategy.put_batch(run_setup.local_train_batch(setup, 0))
    for _ in range(run_summary.TIMING_WARMUP_STEPS):
        params, opt_state, loss = fn(params, opt_state, batch)
    jax.block_until_ready(loss)
    t0 = time.perf_counter()
    for _ in range(steps):
        params, opt_state, loss = fn(params, opt_state, batch)
    jax.block_until_ready((params, loss))
    return steps * config.global_batch_size / (time.perf_counter() - t0)


def loop_images_per_sec(config) -> float:
    with tempfile.TemporaryDirectory() as workdir, contextlib.redirect_stdout(io.StringIO()):
        return trainer.train_and_evaluate(config, workdir).summary.throughput.images_per_sec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vgg19")
    parser.add_argument("--width", type=float, default=0.25)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="also write the result as data (.csv or .json)")
    args = parser.parse_args()
    config = make_config(args)
    bare, loop = [], []
    for r in range(args.repeats):
        bare.append(bare_images_per_sec(config, args.steps))
        loop.append(loop_images_per_sec(config))
        print(
            f"repeat {r + 1}/{args.repeats}: bare {bare[-1]:.1f} img/s, loop {loop[-1]:.1f} img/s",
            flush=True,
        )
    b, lp = statistics.median(bare), statistics.median(loop)
    print(
        f"\n{args.model} width {args.width} batch {args.batch} {args.dtype} on "
        f"{jax.device_count()} {jax.default_backend()} devices, {args.steps} steps x "
        f"{args.repeats} repeats"
    )
    print(f"bare shard_map step : {b:10.1f} images/sec (median)")
    print(f"jaxpar training loop: {lp:10.1f} images/sec (median)")
    print(f"loop / bare         : {lp / b:10.3f}")
    if args.out:
        row = {"model": args.model, "width": args.width, "global_batch": args.batch}
        row |= {"dtype": args.dtype, "devices": jax.device_count()}
        row |= {"backend": jax.default_backend(), "steps": args.steps, "repeats": args.repeats}
        row |= {"bare_images_per_sec": round(b, 1), "loop_images_per_sec": round(lp, 1)}
        datafile.write(args.out, [row | {"loop_over_bare": round(lp / b, 3)}])


if __name__ == "__main__":
    log.setup()  # jaxpar's lines (the trainer's) on stdout
    main()
