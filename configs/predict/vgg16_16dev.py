"""Full-width VGG16 (ImageNet head, 224x224, global batch 512) on 8 and 16 devices: for the
two-node H100 profile, where the data axis of a 16-device mesh crosses InfiniBand.

Run:  python -m jaxpar.predict --profile configs/hardware/h100_sxm_2nodes_ib.py --suite configs/predict/vgg16_16dev.py

Devices are numbered in mesh order (data, stage, tensor), 8 per node: on (16,1,1) the data
all-reduce spans both nodes (hierarchical); on (2,1,8) the tensor axis stays in a node and
only the data axis crosses; on (8,2,1) a replica's two stages are neighbours in one node and
each stage's data all-reduce crosses. The 1-device row keeps batch 64 (a batch of 512 does not
fit one device), so "speedup" there is the throughput ratio at 64 images per device.
"""

from configs.predict import dgx1_vgg16


def get_config():
    suite = dgx1_vgg16.get_config()
    suite.overrides.update({"global_batch_size": 512})
    pipe = {"pipeline.schedule": "1f1b", "pipeline.num_microbatches": 8}
    rows = [
        ("1 device", (1, 1, 1), {"global_batch_size": 64}),
        ("data 8 (one node)", (8, 1, 1), {}),
        ("data 16 (two nodes)", (16, 1, 1), {}),
        ("data 8 x tensor 2", (8, 1, 2), {}),
        ("data 8 x pipeline 2", (8, 2, 1), pipe),
        ("data 2 x tensor 8", (2, 1, 8), {}),
    ]
    suite.rows = tuple(
        {"name": name, "config": {"mesh_shape": shape, **extra}} for name, shape, extra in rows
    )
    return suite
