"""Every partitioning of full-width VGG16 (ImageNet head, 224x224, global batch 256) on 8
devices, for the recommendation line: which one to use on a given machine.

Run:  python -m jaxpar.predict --profile configs/hardware/k80_pcie.py --suite configs/predict/vgg16_partitionings.py
"""

from configs.predict import dgx1_vgg16


def get_config():
    suite = dgx1_vgg16.get_config()
    suite.overrides.update({"global_batch_size": 256})
    pipe = {"pipeline.schedule": "1f1b", "pipeline.num_microbatches": 8}
    rows = [("1 device", (1, 1, 1), {})]
    rows += [(f"data {n}", (n, 1, 1), {}) for n in (2, 4, 8)]
    rows += [(f"pipeline {k} 1f1b M=8", (1, k, 1), pipe) for k in (2, 4, 8)]
    rows += [("pipeline 8 gpipe M=8", (1, 8, 1), {**pipe, "pipeline.schedule": "gpipe"})]
    rows += [(f"tensor {t}", (1, 1, t), {}) for t in (2, 4, 8)]
    rows += [
        (f"hybrid {s}", s, pipe if s[1] > 1 else {}) for s in ((2, 2, 2), (4, 2, 1), (2, 1, 4))
    ]
    suite.rows = tuple(
        {"name": name, "config": {"mesh_shape": shape, **extra}} for name, shape, extra in rows
    )
    return suite
