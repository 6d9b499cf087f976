"""What measuring the gradient noise scale costs a step: the same run with and without it.

    python benchmarks/noise_scale_cost.py [--repeat 3] [--steps 60] [--config.KEY=VALUE ...]

For each mesh, the config (default: the main job's VGG19 at quarter width, 8 simulated
devices) with `measure_noise_scale` on and off: first the compiled step programs' FLOPs and
bytes accessed per device (XLA's cost analysis: exact, whatever the machine's load), then the
median step time of short training runs, alternating on and off `--repeat` times so that the
machine's load falls on both alike. The measurement adds, per step, one pass over each
replica's (or slice's) gradient for its squared norm, one over the combined gradient, and two
scalar all-reduces.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jaxpar import configfile

MESHES = {
    "data 8": {"mesh_shape": (8, 1, 1)},
    "data 2 x tensor 4": {"mesh_shape": (2, 1, 4)},
    "data 2 x fsdp 4": {"mesh_axes": ("data", "fsdp"), "mesh_shape": (2, 4)},
    "hybrid (2,2,2), 1f1b, M=4": {
        "mesh_shape": (2, 2, 2),
        "pipeline.schedule": "1f1b",
        "pipeline.num_microbatches": 4,
    },
    "1 device, 4 slices": {
        "mesh_shape": (1, 1, 1),
        "num_devices": 1,
        "grad_accum_steps": 4,
        "model.batch_norm": False,
    },
}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="configs/vgg19_hybrid.py")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--only", default="", help="the meshes whose name contains this")
    args, rest = parser.parse_known_args(argv)
    overrides, _ = configfile.split_overrides(rest)
    configfile.set_host_device_count(8)
    configfile.cpu_only()
    from jaxpar import log, trainer

    log.setup()

    def config_of(mesh: dict, on: bool):
        config = configfile.load(args.config)
        return configfile.override(
            config,
            {
                "pipeline.num_microbatches": 1,
                **overrides,
                **mesh,
                "measure_noise_scale": on,
                "num_train_steps": args.steps,
                "log_every_steps": args.steps,
                "eval_every_steps": 0,
                "checkpoint_every_steps": 0,
            },
        )

    header = "| mesh | FLOPs, on / off | bytes accessed, on / off | step on | step off | ratio |"
    table = [header, "|---|---|---|---|---|---|"]
    for name, mesh in MESHES.items():
        if args.only not in name:
            continue
        cost = {on: program_cost(config_of(mesh, on)) for on in (True, False)}
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.repeat):
            for on in (True, False):
                with tempfile.TemporaryDirectory() as workdir:
                    summary = trainer.train_and_evaluate(config_of(mesh, on), workdir)
                times[on].append(summary["step_time_median_s"])
        on, off = statistics.median(times[True]), statistics.median(times[False])
        flops = cost[True][0] / cost[False][0]
        moved = cost[True][1] / cost[False][1]
        table.append(
            f"| {name} | {flops:.4f} | {moved:.4f} | {1e3 * on:.2f} ms | "
            f"{1e3 * off:.2f} ms | {on / off:.3f} |"
        )
    print("\n".join(table))


def program_cost(config) -> tuple[float, float]:
    """(FLOPs, bytes accessed) per device of the step's compiled programs, summed over a
    step's calls."""
    import jax

    from jaxpar import run_setup

    setup = run_setup.setup(config)
    programs = setup.strategy.programs(setup.strategy.batch_shapes(config.global_batch_size))
    flops = moved = 0.0
    for p in programs:
        with jax.set_mesh(p.mesh):
            cost = p.compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        flops += p.times * float(cost.get("flops", 0.0))
        moved += p.times * float(cost.get("bytes accessed", 0.0))
    return flops, moved


if __name__ == "__main__":
    main(sys.argv[1:])
