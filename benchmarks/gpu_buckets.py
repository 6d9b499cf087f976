"""Gradient buckets on XLA:GPU's own programs, compiled here for GPUs this machine lacks: one
GPU's training step against the data-parallel step of N GPUs, without buckets and with them.

    python benchmarks/gpu_buckets.py --csv docs/data/gpu_buckets.csv   # 5 models x 3 GPUs, 40 min
    python benchmarks/gpu_buckets.py --models resnet50 --gpus p100_sxm2 --buckets 0 4 25

Every row is tf_cnn_benchmarks' setup (float32, batch 64 per GPU, 1,000 classes, BatchNorm
over each GPU's batch). For each model and GPU it prints the kernels one step launches (the
data-parallel step's excess over one GPU's, and that excess per bucket), the bytes its kernels
outside the matrix kernels move, and its collectives. The target of issue 68: the data-N step
launches at most one GPU's kernels plus a few per bucket.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MODELS = {"resnet50": 224, "resnet152": 224, "inception_v3": 299, "vgg16": 224, "alexnet": 224}
GPUS = ("p100_sxm2", "v100_sxm2_16", "h100_sxm")
PER_GPU_BATCH = 64


def _config(model: str, devices: int, bucket_bytes: int):
    from benchmarks.single_device import config_for

    config = config_for(model, MODELS[model], "float32", PER_GPU_BATCH * devices)
    config.data.num_classes = 1000
    config.model.batch_norm = model != "alexnet"
    config.sync.batch_norm = "local"
    config.sync.bucket_bytes = bucket_bytes
    config.mesh_axes = ("data",)
    config.mesh_shape = (devices,)
    return config


def _buckets(config) -> int:
    """How many buckets the gradient makes at the config's size (0 without buckets)."""
    from jaxpar import models
    from jaxpar.parallel.buckets import Buckets
    from jaxpar.parallel.state import state_shapes
    from jaxpar.run_spec import SyncSpec

    if not config.sync.bucket_bytes:
        return 0
    import optax

    model = models.build(config.model, tuple(config.data.image_shape), config.data.num_classes)
    params = state_shapes(model, optax.sgd(0.1)).params
    return len(Buckets.of(SyncSpec.of_config(config), model).of_tree(params))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--gpus", nargs="*", default=list(GPUS))
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument(
        "--buckets", nargs="*", type=float, default=[0, 25], help="bucket sizes, MiB"
    )
    parser.add_argument("--csv", help="also write the table to this CSV file")
    args = parser.parse_args(argv)

    from jaxpar import configfile

    configfile.make_configs_importable()
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    import jax

    from benchmarks.gpu_programs import figures
    from jaxpar.predict.programs import gputarget

    print(f"JAX {jax.__version__}; deviceless XLA:GPU programs, float32, batch 64 per GPU")
    head = (
        "| model | GPU | devices | bucket MiB | buckets | kernels | excess | excess per bucket "
        "| GB moved | collectives |"
    )
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    table = [[c.strip() for c in head.strip("|").split("|")]]
    for model in args.models:
        for gpu in args.gpus:
            one = None
            runs = [(1, 0)] + [(args.devices, int(b * 2**20)) for b in args.buckets]
            for n, bucket in runs:
                config = _config(model, n, bucket)
                with gputarget.uncached():
                    f = figures(config, gputarget.Target(gpu, 1, n).devices())
                one = f["kernels"] if n == 1 else one
                count = _buckets(config) if n > 1 else 0
                excess = f["kernels"] - one
                cols = ", ".join(f"{k} x{v}" for k, v in sorted(f["collectives"].items())) or "-"
                cells = [
                    model,
                    gpu,
                    str(n),
                    f"{bucket / 2**20:.4g}" if n > 1 else "-",
                    str(count) if count else "-",
                    f"{f['kernels']:,}",
                    f"{excess:+,}" if n > 1 else "-",
                    f"{excess / count:+.1f}" if count else "-",
                    f"{f['moved'] / 1e9:.1f}",
                    cols,
                ]
                print("| " + " | ".join(cells) + " |", flush=True)
                table.append(cells)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            csv.writer(f).writerows(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
