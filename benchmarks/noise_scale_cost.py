"""What measuring the gradient noise scale costs a step: the same run with and without it.

    python benchmarks/noise_scale_cost.py [--repeat 3] [--steps 60] [--config.KEY=VALUE ...]

Trains the config (default: the main job's VGG19 at quarter width, 8 simulated devices) with
`measure_noise_scale` on and off, alternating on and off `--repeat` times so that the
machine's load falls on both alike, and prints each mesh's median step time with and without,
and their ratio. The measurement adds, per step, one pass over each replica's gradient (its
squared norm), one over the combined gradient, and two scalar all-reduces.
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
    args, rest = parser.parse_known_args(argv)
    overrides, _ = configfile.split_overrides(rest)
    configfile.set_host_device_count(8)
    configfile.cpu_only()
    from jaxpar import log, trainer

    log.setup()
    print("| mesh | step, measured | step, not measured | ratio |")
    print("|---|---|---|---|")
    for name, mesh in MESHES.items():
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.repeat):
            for on in (True, False):
                config = configfile.load(args.config)
                configfile.override(config, {
                    **overrides, **mesh, "measure_noise_scale": on,
                    "num_train_steps": args.steps, "log_every_steps": args.steps,
                    "eval_every_steps": 0, "checkpoint_every_steps": 0,
                    "pipeline.num_microbatches": 1,
                })  # fmt: skip
                with tempfile.TemporaryDirectory() as workdir:
                    summary = trainer.train_and_evaluate(config, workdir)
                times[on].append(summary["step_time_median_s"])
        on, off = statistics.median(times[True]), statistics.median(times[False])
        print(f"| {name} | {1e3 * on:.2f} ms | {1e3 * off:.2f} ms | {on / off:.3f} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
