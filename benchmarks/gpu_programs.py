"""XLA:GPU's programs compiled here for a GPU this machine lacks, against the same programs
compiled on that GPU: kernels, memory per GPU, collectives, compile time.

    python benchmarks/gpu_programs.py                      # deviceless only, the default rows
    python benchmarks/gpu_programs.py --rows vgg19:32:float32:128:h100_sxm:1

A row is MODEL:IMAGE:DTYPE:BATCH:GPU:DEVICES[:MESH] (MESH as "data=8" or "data=2,tensor=4";
default data over all DEVICES). For each row it compiles the training step's programs for
DEVICES described GPUs (jaxpar/predict/programs/gputarget.py) and prints the kernels the programs
launch and the bytes their kernels outside the matrix kernels move (opclass), their collectives
and memory per GPU (state plus XLA:GPU's temporaries).
Where JAX sees a GPU (the device machine, installed by requirements-gpu.txt), it compiles the
same programs on it too and prints both, with the difference: the check that the deviceless
programs are the GPU's. `--reference` adds the figures recorded from a lent GPU
(docs/predict.md), which this repository cannot reproduce without one.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

DEFAULT_ROWS = (
    "vgg19:32:float32:128:h100_sxm:1",
    "vgg19:32:bfloat16:512:h200_sxm:1",
    "resnet50:224:bfloat16:128:h100_sxm:1",
    "resnet50:224:bfloat16:256:h200_sxm:1",
    "resnet50:224:float32:128:h200_sxm:1",
    "resnet50:224:bfloat16:192:v100_sxm2_16:1",
)

# Recorded on lent GPUs with benchmarks/single_device.py (JAX 0.11.2, CUDA 13, full width,
# BatchNorm, 10 classes; docs/predict.md, "How close the GPU programs are"): kernels launched
# per step and state + temporaries of the step program, GB. Recorded before BatchNorm's
# statistics took one pass: compare --reference at 20afcf6 (docs/predict.md, "BatchNorm in one
# pass").
RECORDED = {
    "vgg19:32:float32:128:h100_sxm:1": (339, 0.58),
    "vgg19:32:bfloat16:512:h200_sxm:1": (390, 1.01),
    "resnet50:224:bfloat16:128:h100_sxm:1": (1317, 5.43),
    "resnet50:224:bfloat16:256:h200_sxm:1": (1327, 10.65),
    "resnet50:224:float32:128:h200_sxm:1": (1243, 11.19),
}


def _config(model: str, image: int, dtype: str, batch: int, mesh: dict[str, int]):
    from benchmarks.single_device import config_for

    config = config_for(model, image, dtype, batch)
    config.mesh_axes = tuple(mesh)
    config.mesh_shape = tuple(mesh.values())
    return config


def figures(config, devices) -> dict:
    """Kernels, matrix FLOPs, collectives and memory of the step's programs on `devices`."""
    from jaxpar import analysis, collectives
    from jaxpar.predict.kernels import opclass
    from jaxpar.predict.programs.workload import strategy_for

    t0 = time.perf_counter()
    strategy = strategy_for(config, len(devices), devices)
    progs = analysis.programs(strategy, int(config.global_batch_size))
    seconds = time.perf_counter() - t0
    kernels = flops = moved = 0.0
    cols: dict[str, int] = {}
    for p in progs:
        text = p.compiled.as_text()
        ops = opclass.classify(text, "gpu")
        kernels += ops.kernels
        flops += ops.flops
        moved += ops.memory_bytes
        for (kind, axes), (count, _) in collectives.collective_rows(
            text, dict(p.mesh.shape)
        ).items():
            cols[f"{kind} {axes}"] = cols.get(f"{kind} {axes}", 0) + count
    state, temp, stash = analysis.stage_memory(strategy, int(config.global_batch_size), progs)
    memory = max(a + b + c for a, b, c in zip(state, temp, stash))
    return {
        "kernels": int(kernels),
        "flops": flops,
        "moved": moved,
        "memory": memory,
        "collectives": cols,
        "compile_s": seconds,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="*", default=list(DEFAULT_ROWS))
    parser.add_argument("--reference", action="store_true", help="print the recorded figures")
    args = parser.parse_args(argv)

    from jaxpar import configfile

    configfile.make_configs_importable()
    # the CUDA plugin loads without CUDA's libraries (compile-only), as gputarget asks, but
    # before JAX starts here: the GPU count below starts it
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    import jax

    from jaxpar.predict.programs import gputarget

    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    print(f"JAX {jax.__version__}; GPUs here: {len(gpus)} ({gpus[0].device_kind if gpus else '-'})")
    head = "| row | programs | kernels | GB moved | GB/GPU | collectives | compile s |"
    print(head + (" recorded kernels | recorded GB |" if args.reference else ""))
    print("|---" * (head.count("|") - 1 + (2 if args.reference else 0)) + "|")
    for row in args.rows:
        model, image, dtype, batch, gpu, n, *mesh_text = row.split(":")
        n = int(n)
        mesh = (
            {kv.split("=")[0]: int(kv.split("=")[1]) for kv in mesh_text[0].split(",")}
            if mesh_text
            else {"data": n}
        )
        assert math.prod(mesh.values()) == n, f"{row}: mesh {mesh} is not {n} devices"
        config = _config(model, int(image), dtype, int(batch), mesh)
        target = gputarget.Target(gpu, 1, n)
        runs = [("deviceless", target.devices())]
        if len(gpus) >= n:
            runs.append((f"on {gpus[0].device_kind}", gpus[:n]))
        for name, devices in runs:
            with gputarget.uncached() if name == "deviceless" else contextlib.nullcontext():
                f = figures(config, devices)
            cols = ", ".join(f"{k} x{v}" for k, v in sorted(f["collectives"].items())) or "-"
            cells = [
                row,
                name,
                f"{f['kernels']:,}",
                f"{f['moved'] / 1e9:.1f}",
                f"{f['memory'] / 1e9:.2f}",
                cols,
                f"{f['compile_s']:.1f}",
            ]
            if args.reference:
                k, gb = RECORDED.get(row, (None, None))
                cells += [f"{k:,}" if k else "-", f"{gb:.2f}" if gb else "-"]
            print("| " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
