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

# Each row's two repeats (runs/bench_q/rows/*.r0.json, *.r1.json): how far the measurement
# agrees with itself, which --validate prints beside the prediction's figures.
REPEATS = {
    "1 device": (308.7, 352.4),
    "data 2": (334.3, 380.2),
    "data 4": (397.1, 422.3),
    "data 8": (373.5, 383.4),
    "data 8 ZeRO-1": (309.1, 359.1),
    "fsdp 8": (333.3, 344.5),
    "data 2 x fsdp 4": (347.1, 356.3),
    "node 2 x data 4": (371.7, 396.7),
    "pipeline 2 gpipe M=1": (324.4, 328.5),
    "pipeline 2 gpipe M=4": (373.7, 389.9),
    "pipeline 2 gpipe M=8": (302.2, 366.3),
    "pipeline 2 1f1b M=1": (280.9, 313.5),
    "pipeline 2 1f1b M=4": (368.8, 376.7),
    "pipeline 2 1f1b M=8": (346.5, 345.5),
    "pipeline 4 gpipe M=1": (307.6, 307.4),
    "pipeline 4 gpipe M=4": (393.1, 406.8),
    "pipeline 4 gpipe M=8": (324.7, 367.7),
    "pipeline 4 1f1b M=1": (275.2, 304.5),
    "pipeline 4 1f1b M=4": (343.7, 389.5),
    "pipeline 4 1f1b M=8": (322.3, 355.2),
    "pipeline 8 gpipe M=1": (279.5, 276.5),
    "pipeline 8 gpipe M=4": (307.5, 346.9),
    "pipeline 8 gpipe M=8": (305.7, 274.7),
    "pipeline 8 1f1b M=1": (281.0, 248.1),
    "pipeline 8 1f1b M=4": (345.0, 346.1),
    "pipeline 8 1f1b M=8": (314.2, 273.5),
    "tensor 2": (332.0, 330.6),
    "tensor 4": (309.5, 339.0),
    "tensor 8": (269.7, 242.9),
    "hybrid (2, 2, 2)": (232.4, 262.6),
    "hybrid (4, 2, 1)": (279.4, 269.6),
    "hybrid (2, 1, 4)": (289.6, 307.2),
    "hybrid (1, 4, 2)": (258.2, 266.2),
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
    out.repeats = tuple((name, *rates) for name, rates in REPEATS.items())
    return out
