"""What measuring the gradient noise scale costs a step, and what AdaScale adds on top of it:
the same run with and without each.

    python benchmarks/noise_scale_cost.py [--repeat 3] [--steps 60] [--only NAME]
        [--tables noise,adascale] [--config.KEY=VALUE ...]

For each mesh, the config (default: the main job's VGG19 at quarter width, 8 simulated
devices) in up to three variants: `measure_noise_scale` off; on; and on with
`lr_adaptation=adascale` at `lr_base_batch_size` = half the global batch (so that AdaScale's
gain is not trivially 1). Two tables compare them: "noise" (the measurement on / off) and
"adascale" (AdaScale on / off, the measurement on in both). Each row gives first the compiled
step programs' FLOPs and bytes accessed per device (XLA's cost analysis: exact, whatever the
machine's load), then the median step time of short training runs, the variants alternating
`--repeat` times so that the machine's load falls on all alike, and each repeat's own ratio
(its spread is the clock's noise). `--tables noise` runs only the first two variants.

The measurement adds, per step, one pass over each replica's (or slice's, or micro-batch's)
gradient for its squared norm, one over the combined gradient, and scalar all-reduces;
AdaScale adds the gain's scalar arithmetic to the update (on a pipeline, the update split in
two programs with the model's norms added between them). An AdaScale run ends when its
progress reaches `--steps`, so it times fewer steps (its gain is above 1).
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

# Each table: (its title, the variant measured, the variant it is divided by).
TABLES = {
    "noise": ("noise scale measured, on / off", "on", "off"),
    "adascale": ("AdaScale, on / off (the noise scale measured in both)", "adascale", "on"),
}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="configs/vgg19_hybrid.py")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--only", default="", help="the meshes whose name contains this")
    parser.add_argument("--tables", default="noise,adascale", help="noise, adascale or both")
    args, rest = parser.parse_known_args(argv)
    overrides, _ = configfile.split_overrides(rest)
    tables = [name.strip() for name in args.tables.split(",") if name.strip()]
    if unknown := [name for name in tables if name not in TABLES]:
        parser.error(f"unknown tables {unknown}; choose from {sorted(TABLES)}")
    variants = list(dict.fromkeys(v for name in tables for v in TABLES[name][1:]))
    configfile.set_host_device_count(8)
    configfile.cpu_only()
    from jaxpar import log, trainer

    log.setup()

    def config_of(mesh: dict, variant: str):
        config = configfile.load(args.config)
        config = configfile.override(
            config,
            {
                "pipeline.num_microbatches": 1,
                **overrides,
                **mesh,
                "measure_noise_scale": variant != "off",
                "num_train_steps": args.steps,
                "log_every_steps": args.steps,
                "eval_every_steps": 0,
                "checkpoint_every_steps": 0,
            },
        )
        if variant == "adascale":
            base = config.global_batch_size // 2
            adapt = {"lr_adaptation": "adascale", "lr_base_batch_size": base}
            config = configfile.override(config, adapt)
        return config

    rows: dict[str, list[str]] = {name: [] for name in tables}
    for name, mesh in MESHES.items():
        if args.only not in name:
            continue
        cost = {v: program_cost(config_of(mesh, v)) for v in variants}
        times: dict[str, list[float]] = {v: [] for v in variants}
        for r in range(args.repeat):
            # alternate the order, so that neither variant always runs first
            for v in variants if r % 2 == 0 else variants[::-1]:
                with tempfile.TemporaryDirectory() as workdir:
                    summary = trainer.train_and_evaluate(config_of(mesh, v), workdir).summary
                times[v].append(summary.throughput.step_time_median_s)
        for table in tables:
            _, a, b = TABLES[table]
            rows[table].append(_row(name, cost[a], cost[b], times[a], times[b]))
    for table in tables:
        header = (
            "| mesh | FLOPs, on / off [exact] | bytes accessed, on / off [exact] | step on | "
            "step off | time ratio [clock] | each repeat's ratio [clock] |"
        )
        print(f"\n{TABLES[table][0]}:\n")
        print("\n".join([header, "|---|---|---|---|---|---|---|", *rows[table]]))


def _row(name: str, cost_on, cost_off, times_on: list, times_off: list) -> str:
    """One table row: exact cost ratios, median step times, their ratio and each repeat's."""
    on, off = statistics.median(times_on), statistics.median(times_off)
    each = ", ".join(f"{a / b:.3f}" for a, b in zip(times_on, times_off))
    return (
        f"| {name} | {cost_on[0] / cost_off[0]:.4f} | {cost_on[1] / cost_off[1]:.4f} | "
        f"{1e3 * on:.2f} ms | {1e3 * off:.2f} ms | {on / off:.3f} | {each} |"
    )


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
