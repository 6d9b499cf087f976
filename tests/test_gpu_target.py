"""XLA:GPU's own programs compiled here, without a GPU (jaxpar/predict/programs/gputarget.py): every
kind of partitioning compiles for eight H100s, the programs hold cuDNN convolutions and
XLA:GPU's asynchronous collectives, their kernels do the CPU program's multiply-adds, memory
per GPU is XLA:GPU's buffer assignment, and a machine that cannot compile for a GPU says so
in one line and predicts from the CPU programs."""

from __future__ import annotations

import logging

import pytest

from jaxpar import analysis, hlo
from jaxpar.predict.kernels import library, opclass
from jaxpar.predict.profiles import fitting, hardware
from jaxpar.predict.programs import gputarget
from jaxpar.predict.programs.workload import strategy_for, workload
from tests.util import tiny_config

pytestmark = pytest.mark.skipif(
    bool(gputarget.unavailable("h100_sxm")),
    reason=f"no compile-only XLA:GPU here: {gputarget.unavailable('h100_sxm')}",
)

H100 = gputarget.Target("h100_sxm", 1, 8)

MESHES = {
    "data": (("data",), (8,), {}),
    "fsdp": (("fsdp",), (8,), {}),
    "stage": (("stage",), (2,), {"pipeline.schedule": "1f1b", "pipeline.num_microbatches": 2}),
    "tensor": (("tensor",), (2,), {}),
    "spatial": (("spatial",), (2,), {}),
}


def _config(kind: str):
    names, sizes, extra = MESHES[kind]
    return tiny_config(mesh_axes=names, mesh_shape=sizes, **extra)


@pytest.mark.parametrize("kind", sorted(MESHES))
def test_every_partitioning_compiles_for_h100s(kind):
    """Each kind of mesh: XLA:GPU's programs for H100s (cuDNN convolutions, no CPU
    convolutions), memory per GPU from their buffer assignment, the collectives the mesh needs
    as XLA:GPU emits them."""
    config = _config(kind)
    w = workload(config, 8, H100)
    assert w.compiled_for.startswith("XLA:GPU") and "H100" in w.compiled_for
    strategy = strategy_for(config, 8, H100.devices())
    progs = analysis.programs(strategy, config.global_batch_size)
    texts = [p.compiled.as_text() for p in progs]
    assert all("__cudnn$conv" in t or "__cudnn" not in t for t in texts)
    assert sum(t.count('custom_call_target="__cudnn$conv') for t in texts) > 0
    assert not any(" convolution(" in t for t in texts)  # every convolution is a cuDNN call
    # A cuDNN call's result and workspace (an activation or a gradient, never the step's
    # output) are XLA:GPU temporaries: sized here from the program text, not from XLA's
    # buffer assignment.
    largest = _largest_cudnn_call(texts)
    assert largest > 0 and max(s.temp_bytes for s in w.stages) >= largest
    assert w.memory_bytes_per_device == max(s.memory_bytes for s in w.stages)
    assert all(s.memory_bytes >= s.state_bytes + s.temp_bytes for s in w.stages)
    kinds = {c.kind for ch in w.chunks for cols in ch.collectives.values() for c in cols}
    needed = {
        "data": "all-reduce",
        "fsdp": "reduce-scatter",
        "tensor": "all-reduce",
        "spatial": "collective-permute",
    }
    if kind in needed:
        assert needed[kind] in kinds, kinds


def test_gpu_kernels_do_the_cpu_programs_multiply_adds():
    """The single-device step: the FLOPs of its cuDNN calls and Triton GEMMs (read from each
    kernel's shapes, forward, input gradient and weight gradient alike) equal those of the CPU
    program's convolutions and dots; three kernels per convolution but the first's input
    gradient."""
    config = tiny_config(mesh_axes=("data",), mesh_shape=(1,))
    gpu = workload(config, 1, H100.single()).chunks[0].op_classes("step")
    cpu = workload(config, 1).chunks[0].op_classes("step")
    assert gpu.flops == pytest.approx(cpu.flops, rel=1e-9)
    convs = [m for m in gpu.matmuls if m.keys]
    kinds = [m.keys[0][-1] for m in convs]
    # VGG11's 8 convolutions: each a forward and a weight gradient, and an input gradient
    # but the first's (XLA:GPU runs some gradients as forward convolutions, of the reversed
    # kernel or of the transposed input, so the kinds are XLA:GPU's, not the layers')
    assert len(kinds) == 3 * 8 - 1 and "filter gradient" in kinds and "input gradient" in kinds
    first = [m for m in convs if m.keys[0][3] == 3 and m.keys[0][-1] == "forward"]
    assert first and all(m.thin for m in first)  # the first layer: 3 input channels


def test_library_call_reads_each_convolution_kind():
    """One 3x3 convolution, x [8,16,16,4] -> y [8,16,16,12], in XLA:GPU's three kernels: each
    does 2 x 8*16*16 x 12 x 3*3*4 FLOPs, stride 1 (Winograd), a tile of 4 input channels."""
    types = {
        "x": "f32[8,16,16,4]{3,2,1,0}",
        "w": "f32[12,3,3,4]{3,2,1,0}",
        "dy": "f32[8,16,16,12]{3,2,1,0}",
    }
    tail = "window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_o01i->b01f, custom_call_target="
    calls = {
        "forward": ("(f32[8,16,16,12]{3,2,1,0}, u8[0]{0})", "%x, %w", "convForward"),
        "input gradient": ("(f32[8,16,16,4]{3,2,1,0}, u8[0]{0})", "%dy, %w", "convBackwardInput"),
        "filter gradient": ("(f32[12,3,3,4]{3,2,1,0}, u8[0]{0})", "%x, %dy", "convBackwardFilter"),
    }
    flops = 2.0 * 8 * 16 * 16 * 12 * 3 * 3 * 4
    for kind, (result, args, target) in calls.items():
        ins = hlo.Instruction("c", result, "custom-call", f'{args}), {tail}"__cudnn${target}"')
        ops = opclass.matrix_classes(library.library_matmul(ins, types))
        (m,) = ops.matmuls
        assert ops.conv3x3_flops == pytest.approx(flops) and m.winograd
        assert m.keys == ((8, 16, 16, 4, 12, 3, 3, 1, 1, 16, 16, kind),)
        assert m.tile == 4 and m.thin == (kind != "input gradient")


def test_a_profile_compiles_for_its_gpu_or_says_why_not(monkeypatch, caplog):
    """The H100 profile's target is its 8 GPUs on one node; where the plugin is switched off
    the same profile predicts from CPU programs and says why in one line; a K80 is below CUDA
    12's compute capabilities."""
    profile = hardware.replace(_profile(), gpu="h100_sxm", num_devices=16, devices_per_node=8)
    assert gputarget.of(profile) == gputarget.Target("h100_sxm", 2, 8)
    assert {d.process_index for d in gputarget.of(profile).devices()} == {0, 1}
    monkeypatch.setenv("JAXPAR_NO_GPU_TARGET", "1")
    with caplog.at_level(logging.WARNING):
        assert gputarget.of(profile) is None and gputarget.of(profile) is None
    said = [r.getMessage() for r in caplog.records if "simulated" in r.getMessage()]
    assert len(said) == 1 and "JAXPAR_NO_GPU_TARGET" in said[0]
    assert "compute capability 3.7" in gputarget.unavailable("k80")


def test_memory_per_gpu_is_xla_gpus_not_the_cpus():
    """A row's memory per GPU comes from the programs compiled for that GPU (and says so):
    its temporaries hold XLA:GPU's cuDNN calls, which a CPU program has none of, and the state
    is the same bytes on either."""
    from jaxpar.predict.step.model import predict_workload

    config = _config("data")
    gpu, cpu = workload(config, 8, H100), workload(config, 8)
    assert gpu.stages[0].state_bytes == cpu.stages[0].state_bytes
    with gputarget.uncached():
        gpu_texts = [
            p.compiled.as_text()
            for p in analysis.programs(
                strategy_for(config, 8, H100.devices()), config.global_batch_size
            )
        ]
    cpu_texts = [
        p.compiled.as_text()
        for p in analysis.programs(strategy_for(config, 8), config.global_batch_size)
    ]
    assert _largest_cudnn_call(cpu_texts) == 0
    assert gpu.stages[0].temp_bytes >= _largest_cudnn_call(gpu_texts) > 0
    row = predict_workload(gpu, hardware.replace(_profile(), gpu="h100_sxm"))
    assert row.memory_bytes_per_device == gpu.memory_bytes_per_device
    assert row.memory_from.startswith("XLA:GPU programs compiled here for 8x NVIDIA H100")


def _largest_cudnn_call(texts: list[str]) -> int:
    """Bytes of the largest cuDNN convolution's result and workspace in these programs."""
    sizes = [
        hlo.shape_bytes(ins.type)
        for text in texts
        for _, ins in hlo.parse(text).instructions()
        if ins.opcode == "custom-call"
        and "__cudnn$conv" in (ins.attribute("custom_call_target") or "")
    ]
    return max(sizes, default=0)


def _profile() -> hardware.Profile:
    return fitting.from_config(
        {
            "name": "test GPU",
            "num_devices": 8,
            "devices_per_node": 8,
            "peak_flops": {"float32": 1e14},
            "memory_bytes": 80e9,
            "intra": {"bandwidth": 3e11, "latency": 5e-6},
            "compute_efficiency": 0.5,
            "compiler": "gpu",
            "memory_bandwidth": 3e12,
        }
    )


def test_the_donated_state_is_updated_in_place_on_gpus():
    """XLA chooses the state's layouts in memory (`Layout.AUTO`), so a convolution's weight is
    kept in the layout cuDNN's weight gradient arrives in and its update writes the donated
    buffer: no leaf of the new state leaves the H100 step through a copy. (In the parameters'
    default layouts, ResNet-20's updated weights are each copied into their buffers.)"""
    config = tiny_config(mesh_axes=("data",), mesh_shape=(1,), **{"model.name": "resnet20"})
    target = gputarget.Target("h100_sxm", 1, 1)
    with gputarget.uncached():
        (step,) = analysis.programs(strategy_for(config, 1, target.devices()), 16)
    program = hlo.parse(step.compiled.as_text())
    by_name = program.by_name
    root = program.entry[-1]
    assert root.opcode == "tuple" and len(root.operands) > 80
    assert [name for name in root.operands if by_name[name].opcode == "copy"] == []
