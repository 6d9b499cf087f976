"""Compile for a GPU this machine does not have: XLA:GPU's own programs, without a GPU.

JAX's CUDA plugin compiles ahead of time for a described GPU (`jax.experimental.topologies`,
the compile-only devices MaxText uses for the same purpose). The description is what XLA's
cost model and buffer assignment read: the GPU's streaming multiprocessors, clock, memory
bandwidth and size, caches and compute capability. The programs it produces are the ones a
GPU of that kind runs: cuDNN and cuBLAS calls, XLA:GPU's fusions, its asynchronous
collectives and its buffer assignment (memory per GPU), with no autotuning (the convolution
algorithms are picked on the GPU at run time; the programs' kernels and memory do not depend
on them).

The packages it needs are jax-cuda12-plugin and jax-cuda12-pjrt of the pinned JAX release
(requirements-gpu-compile.txt: about 0.6 GB, no CUDA runtime libraries). Without them `target` says
so in one line and the caller compiles for simulated CPU devices instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import logging
import os

from jaxpar import compile_cache

log = logging.getLogger(__name__)

GiB = 1 << 30
KiB = 1 << 10
# CUDA 12, which JAX's CUDA plugin is built with, compiles for compute capability 5.0 and above.
MIN_CAPABILITY = (5, 0)


@dataclasses.dataclass(frozen=True)
class Gpu:
    """A GPU's published figures (NVIDIA's datasheets and architecture whitepapers), as XLA's
    GPU target description holds them."""

    description: str  # as the driver names the device
    sms: int  # streaming multiprocessors
    clock_ghz: float  # boost clock
    memory_bandwidth: float  # bytes/s
    memory_bytes: int
    l2_bytes: int
    shared_per_sm: int  # bytes of shared memory per SM
    shared_per_block: int  # the most one block may opt into
    capability: tuple[int, int]
    fp32_per_sm: int  # FP32 lanes per SM

    def target_config(self) -> str:
        """XLA's GpuTargetConfigProto, as text."""
        major, minor = self.capability
        return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: {48 * KiB}
  shared_memory_per_core: {self.shared_per_sm}
  threads_per_core_limit: 2048
  core_count: {self.sms}
  fpus_per_core: {self.fp32_per_sm}
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {int(self.memory_bandwidth)}
  l2_cache_size: {self.l2_bytes}
  clock_rate_ghz: {self.clock_ghz}
  device_memory_size: {self.memory_bytes}
  shared_memory_per_block_optin: {self.shared_per_block}
  cuda_compute_capability {{ major: {major} minor: {minor} }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
device_description_str: "{self.description}"
"""


GPUS = {
    "h100_sxm": Gpu(
        "NVIDIA H100 80GB HBM3",
        132,
        1.98,
        3.35e12,
        80 * GiB,
        50 * 1024 * KiB,
        228 * KiB,
        227 * KiB,
        (9, 0),
        128,
    ),
    "h200_sxm": Gpu(
        "NVIDIA H200",
        132,
        1.98,
        4.8e12,
        141 * GiB,
        50 * 1024 * KiB,
        228 * KiB,
        227 * KiB,
        (9, 0),
        128,
    ),
    "a100_sxm_80": Gpu(
        "NVIDIA A100-SXM4-80GB",
        108,
        1.41,
        2.039e12,
        80 * GiB,
        40 * 1024 * KiB,
        164 * KiB,
        163 * KiB,
        (8, 0),
        64,
    ),
    "v100_sxm2_16": Gpu(
        "Tesla V100-SXM2-16GB",
        80,
        1.53,
        900e9,
        16 * GiB,
        6 * 1024 * KiB,
        96 * KiB,
        96 * KiB,
        (7, 0),
        64,
    ),
    "p100_sxm2": Gpu(
        "Tesla P100-SXM2-16GB",
        56,
        1.48,
        732e9,
        16 * GiB,
        4 * 1024 * KiB,
        64 * KiB,
        48 * KiB,
        (6, 0),
        64,
    ),
    "gtx1080ti": Gpu(
        "NVIDIA GeForce GTX 1080 Ti",
        28,
        1.582,
        484e9,
        11 * GiB,
        2816 * KiB,
        96 * KiB,
        48 * KiB,
        (6, 1),
        128,
    ),
    "m60": Gpu(
        "Tesla M60", 16, 1.178, 160e9, 8 * GiB, 2 * 1024 * KiB, 96 * KiB, 48 * KiB, (5, 2), 128
    ),
    # one GK210 of a K80: compute capability 3.7, below what CUDA 12 compiles for
    "k80": Gpu(
        "Tesla K80", 13, 0.875, 240e9, 12 * GiB, 1536 * KiB, 112 * KiB, 48 * KiB, (3, 7), 192
    ),
}


@dataclasses.dataclass(frozen=True)
class Target:
    """A GPU kind and the topology to compile for: `nodes` hosts of `per_node` GPUs."""

    gpu: str
    nodes: int = 1
    per_node: int = 1

    @property
    def spec(self) -> Gpu:
        return GPUS[self.gpu]

    @property
    def num_devices(self) -> int:
        return self.nodes * self.per_node

    def devices(self) -> list:
        """Compile-only devices of this topology (process i holds node i's GPUs)."""
        return list(_devices(self.gpu, self.nodes, self.per_node))

    def single(self) -> Target:
        """The same GPU alone (single-device calibration runs)."""
        return Target(self.gpu, 1, 1)

    def describe(self) -> str:
        return f"XLA:GPU programs compiled here for {self.num_devices}x {self.spec.description}"


@functools.cache
def _devices(gpu: str, nodes: int, per_node: int) -> tuple:
    from jax.experimental import topologies

    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    topology = topologies.get_topology_desc(
        gpu, "cuda", target_config=GPUS[gpu].target_config(), topology=f"1x{nodes}x{per_node}"
    )
    return tuple(topology.devices)


def uncached() -> contextlib.AbstractContextManager:
    """JAX's persistent compilation cache off while compile-only programs are built: JAX 0.10.2
    loads a cached entry into a client that can run it, which compile-only devices lack (it
    warns and compiles again), so such entries would only fill the cache."""
    return compile_cache.off()


def programs_line(target: Target | None) -> str:
    """What a prediction's programs, and so its memory per device, are read from."""
    if target is None:
        return "programs: XLA:CPU's, compiled for simulated CPU devices"
    return f"programs: {target.describe()} (memory per GPU: XLA:GPU's buffer assignment)"


def unavailable(gpu: str) -> str:
    """Why programs cannot be compiled for `gpu` here ("" where they can)."""
    if gpu not in GPUS:
        return f"no GPU description {gpu!r}; known: {', '.join(sorted(GPUS))}"
    if GPUS[gpu].capability < MIN_CAPABILITY:
        major, minor = GPUS[gpu].capability
        return (
            f"the {GPUS[gpu].description} (compute capability {major}.{minor}) is below "
            "what CUDA 12 compiles for (5.0)"
        )
    if os.environ.get("JAXPAR_NO_GPU_TARGET"):
        return "JAXPAR_NO_GPU_TARGET is set"
    if importlib.util.find_spec("jax_plugins.xla_cuda12") is None:
        return "JAX's CUDA plugin is not installed (pip install -r requirements-gpu-compile.txt)"
    return ""


@functools.cache
def _say(gpu: str, why: str) -> None:
    """One line, once per GPU and reason, for a profile whose GPU programs cannot be compiled."""
    log.warning("predicting %s from XLA:CPU programs on simulated devices: %s", gpu, why)


def target(gpu: str, num_devices: int, per_node: int) -> Target | None:
    """The compile target of a GPU profile, or None (said once, in one line) where this machine
    cannot compile for it: the caller then compiles for simulated CPU devices."""
    if not gpu:
        return None
    why = unavailable(gpu)
    if why:
        _say(gpu, why)
        return None
    per_node = min(per_node, num_devices)
    return Target(gpu, max(1, num_devices // per_node), per_node)


def of(profile) -> Target | None:  # a hardware.Profile
    """What `profile`'s programs are compiled for: its GPUs, or None (simulated CPU devices)."""
    device = profile.device
    return target(device.gpu, device.num_devices, device.devices_per_node)
