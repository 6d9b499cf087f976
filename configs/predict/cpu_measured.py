"""The default bench suite (configs/bench/partitionings.py: VGG19 width 0.25, BatchNorm,
shapes10, global batch 64) as measured on this machine, each row's images/sec the mean of two
interleaved repeats [clock], to compare with the CPU profile's predictions. Measured
2026-11-26 on a quiet machine (load average below 2; 2 x86 cores, 8 simulated devices, JAX
0.10.2) with

    python -m jaxpar.bench --out runs/bench_q --repeat 2             # 15 min

Run:  python -m jaxpar.predict --profile configs/hardware/cpu_2core.py --suite configs/predict/cpu_measured.py
      python -m jaxpar.predict --validate --profile configs/hardware/cpu_2core.py
"""

from configs.bench import partitionings, suite

MEASURED = {
    "1 device": 330.5,
    "data 2": 357.3,
    "data 4": 409.7,
    "data 8": 378.4,
    "data 8 ZeRO-1": 334.1,
    "fsdp 8": 338.9,
    "data 2 x fsdp 4": 351.7,
    "node 2 x data 4": 384.2,
    "pipeline 2 gpipe M=1": 326.4,
    "pipeline 2 gpipe M=4": 381.8,
    "pipeline 2 gpipe M=8": 334.3,
    "pipeline 2 1f1b M=1": 297.2,
    "pipeline 2 1f1b M=4": 372.8,
    "pipeline 2 1f1b M=8": 346.0,
    "pipeline 4 gpipe M=1": 307.5,
    "pipeline 4 gpipe M=4": 400.0,
    "pipeline 4 gpipe M=8": 346.2,
    "pipeline 4 1f1b M=1": 289.8,
    "pipeline 4 1f1b M=4": 366.6,
    "pipeline 4 1f1b M=8": 338.8,
    "pipeline 8 gpipe M=1": 278.0,
    "pipeline 8 gpipe M=4": 327.2,
    "pipeline 8 gpipe M=8": 290.2,
    "pipeline 8 1f1b M=1": 264.5,
    "pipeline 8 1f1b M=4": 345.5,
    "pipeline 8 1f1b M=8": 293.9,
    "tensor 2": 331.3,
    "tensor 4": 324.3,
    "tensor 8": 256.3,
    "hybrid (2, 2, 2)": 247.5,
    "hybrid (4, 2, 1)": 274.5,
    "hybrid (2, 1, 4)": 298.4,
    "hybrid (1, 4, 2)": 262.2,
}


def get_config():
    spec = partitionings.get_config()
    rows = (
        # a bench row's `scaling` would mark its `reference` as an accuracy figure
        {**{k: v for k, v in r.items() if k != "scaling"}, "reference": MEASURED[r["name"]]}
        for r in spec.rows
        if r["name"] in MEASURED
    )
    out = suite(spec.base, dict(spec.overrides), rows)
    out.measured_here = True  # --validate: a median error and a ranking, not published points
    return out
