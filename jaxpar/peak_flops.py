"""Peak dense FLOP/s per device of the GPUs jaxpar measures on or predicts for, by compute
dtype: the one table that the bench's MFU (`jaxpar/bench/row.py`, keyed by JAX's
`device_kind`) and the hardware profiles' compute rates (`configs/hardware/h100_*.py`) read.

"float32" is the TF32 tensor-core rate, not the FP32 (CUDA core) one: under JAX's default
matmul precision XLA runs float32 convolutions and matmuls on TF32 tensor cores on Ampere and
Hopper. A run with `jax_default_matmul_precision="highest"` gets at most the FP32 rate noted
beside each entry. "bfloat16" is the BF16 tensor-core rate. All figures are dense (NVIDIA's
datasheets headline the 2:4-sparse rates, twice these).
"""

from __future__ import annotations

# NVIDIA H100 SXM5 80 GB (datasheet; "NVIDIA H100 Tensor Core GPU Architecture" whitepaper,
# table of H100 SXM5 peaks): TF32 tensor 494.7 TFLOP/s dense (989.4 sparse), BF16 tensor 989.4
# dense (1978.9 sparse); FP32 non-tensor 66.9 (the datasheet's "67 teraFLOPS").
H100_SXM = {"float32": 494.7e12, "bfloat16": 989.4e12}
# NVIDIA H200 SXM 141 GB (datasheet): the H100 SXM's compute with more, faster memory.
H200_SXM = H100_SXM
# NVIDIA A100 SXM4 40/80 GB (datasheet): TF32 tensor 156 dense, BF16 tensor 312 dense;
# FP32 non-tensor 19.5.
A100_SXM = {"float32": 156e12, "bfloat16": 312e12}

BY_DEVICE_KIND = {  # jax.devices()[0].device_kind -> peaks
    "NVIDIA H100 80GB HBM3": H100_SXM,
    "NVIDIA H200": H200_SXM,
    "NVIDIA A100-SXM4-80GB": A100_SXM,
    "NVIDIA A100-SXM4-40GB": A100_SXM,
}


def of_device(device_kind: str, dtype: str) -> float | None:
    """Peak FLOP/s of one device of `device_kind` at `dtype`; None where the table has none."""
    return BY_DEVICE_KIND.get(device_kind, {}).get(dtype)
