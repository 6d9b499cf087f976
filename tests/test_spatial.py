"""Spatial partitioning (jaxpar/axes/spatial.py): every family's feature maps split by rows
computes the one-device function, with halos of exactly the rows the kernels reach, and less
memory per device; a split that cannot run is refused in one line or joined where stated."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from jaxpar import analysis, collectives, explain, models, run_setup
from jaxpar.axes import spatial
from jaxpar.errors import ConfigError
from tests.test_model_zoo import FAMILIES, RTOL, every_block_kind_once, family_config  # noqa: F401
from tests.util import max_rel_error, override, reference_run, run_steps, tiny_config, tiny_profile

STEPS = 3


def spatial_config(family, mesh_axes, mesh_shape, **overrides):
    return family_config(
        family,
        True,
        **{
            "mesh_axes": mesh_axes,
            "mesh_shape": mesh_shape,
            "num_devices": math.prod(mesh_shape),
            **overrides,
        },
    )


def assert_equal_to_one_device(config, rtol, microbatches=1, reference=None):
    """`reference`: the one-device run (losses, state) where the caller has it already."""
    if reference is None:
        one = override(config.copy_and_resolve_references(), {"num_devices": 0})
        reference = reference_run(one, STEPS, microbatches=microbatches)
    ref_losses, ref_state = reference
    losses, state = run_steps(config, math.prod(config.mesh_shape), STEPS)
    np.testing.assert_allclose(losses, ref_losses, rtol=rtol)
    assert max_rel_error(state.params, ref_state.params) < rtol
    assert max_rel_error(state.batch_stats, ref_state.batch_stats) < rtol


# (family, spatial sizes, input, layers at least on bands): ResNet-50's 7x7 stride-2 stem and
# stride-2 bottlenecks on 4 bands (ResNet-20 runs 2 and 4), at 32x32 (stem 16, pool 8, 8, 4, 2, 1 rows); Inception-v3's stem and modules A, B and C at 138x138, the smallest input whose
# maps stay even through its 1x7/7x1 modules (stem 14, A 14, B 6, C 6: bands of 3 rows under
# 7-row windows);
# torchvision's AlexNet at 236x236, the smallest input from 224 whose 11x11 stride-4 stem
# writes an even map (58; at 224 every map is odd: 55, 27, 13), so conv1 runs on bands and the
# maps join at conv2 (28 rows pooled to 13).
CASES = [
    ("resnet20", (2, 4), None, 2),
    ("resnet50", (4,), (32, 32, 3), 3),
    ("inception_v3", (2,), (138, 138, 3), 4),
    ("alexnet224", (2,), (236, 236, 3), 1),
]


@pytest.mark.usefixtures("every_block_kind_once")  # the zoo's shallow model of each family
@pytest.mark.parametrize(("family", "sizes", "shape", "split"), CASES, ids=[c[0] for c in CASES])
def test_every_family_split_by_rows_equals_one_device(family, sizes, shape, split, monkeypatch):
    f = FAMILIES[family]
    if family == "inception_v3":  # the stem and modules A, B and C (1x7/7x1) are the cases
        from jaxpar.models import inception

        zoo = inception.sequential
        monkeypatch.setattr(
            inception,
            "sequential",
            lambda name, modules, *a: zoo(
                name, [m for m in modules if m[0] not in ("mixed7a", "mixed7b")], *a
            ),
        )
        models.forget_built()
    extra = {"data.image_shape": shape} if shape else {}
    with jax.enable_x64(f.dtype == "float64"):
        one = spatial_config(family, ("spatial",), (1,), **extra)
        reference = reference_run(override(one, {"num_devices": 0}), STEPS)
        for s in sizes:
            config = spatial_config(family, ("spatial",), (s,), **extra)
            model = models.build(config.model, config.data.image_shape, 10)
            layers = spatial.plan(model, s)
            assert sum(x.split for x in layers) >= split, layers  # a split, not a join at once
            assert_equal_to_one_device(config, RTOL[f.dtype], reference=reference)


def test_vgg19_data_by_spatial_equals_one_device():
    """In float64, as the zoo's VGG with BatchNorm: its BatchNorm biases' gradients nearly
    cancel, so float32's summation order alone moves them by 1e-5 relative."""
    config = tiny_config(
        **{
            "model.name": "vgg19",
            "model.width": 1 / 16,
            "model.batch_norm": True,
            "model.dtype": "float64",
            "mesh_axes": ("data", "spatial"),
            "mesh_shape": (4, 2),
        }
    )
    with jax.enable_x64(True):
        assert_equal_to_one_device(config, 1e-10)


@pytest.mark.parametrize(
    "mesh",
    [(("stage", "spatial"), (2, 2)), (("spatial", "tensor"), (2, 2))],
    ids=["stage-spatial", "spatial-tensor"],
)
def test_hybrids_with_stage_and_tensor_equal_one_device(mesh):
    axes, shape = mesh
    config = tiny_config(
        **{
            "model.name": "vgg11",
            "model.width": 1 / 8,
            "model.batch_norm": True,
            "mesh_axes": axes,
            "mesh_shape": shape,
            "num_devices": 4,
            "pipeline.schedule": "1f1b",
            "pipeline.num_microbatches": 2,
        }
    )
    assert_equal_to_one_device(config, 1e-5, microbatches=2 if "stage" in axes else 1)


def _eval_collectives(config):
    setup = run_setup.setup(config, jax.devices()[: config.num_devices])
    st = setup.strategy
    batch = st.batch_shapes(config.global_batch_size, eval=True)
    with jax.set_mesh(st.mesh):
        text = st.jit_eval().lower(st.state_shapes(), batch).compile().as_text()
    return setup, collectives.collective_rows(text, dict(st.mesh.shape))


@pytest.mark.usefixtures("every_block_kind_once")
@pytest.mark.parametrize(("family", "s"), [("vgg", 4), ("resnet50", 2)])
def test_halo_bytes_are_what_the_kernels_reach(family, s):
    """The forward program's collective-permutes over `spatial` move, per device, exactly the
    rows the plan reads off the kernel sizes, strides and paddings (one all-gather where the
    maps join), so --explain's halo table is the program's."""
    config = spatial_config(family, ("data", "spatial"), (2, s), **{"model.dtype": "float32"})
    model, rows = _eval_collectives(config)
    layers = spatial.plan(model.model, s)
    per_device = config.global_batch_size // 2
    halo = sum(x.halo_elements for x in layers) * 4 * per_device
    assert rows[("collective-permute", "spatial")][1] == halo > 0
    assert ("all-gather", "spatial") in rows
    # by hand, VGG11's first layer: a 3x3 conv on the 32x32x3 image, 1 row from each neighbour
    if family == "vgg":
        assert layers[0].halo_rows == 2 and layers[0].halo_elements == 2 * 32 * 3


def test_memory_per_device_falls_with_spatial():
    temps = []
    for size in (1, 2, 4):
        config = tiny_config(
            **{
                "model.name": "vgg11",
                "model.width": 1 / 8,
                "global_batch_size": 32,
                "mesh_axes": ("spatial",),
                "mesh_shape": (size,),
                "num_devices": size,
            }
        )
        setup = run_setup.setup(config, jax.devices()[: config.num_devices])
        fig = analysis.report(setup.strategy, config.global_batch_size, timing=False)
        temps.append(fig["program_temp_bytes_per_device"])
    assert temps[1] < 0.7 * temps[0] and temps[2] < 0.7 * temps[1], temps


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"data.image_shape": (36, 36, 3), "mesh_shape": (8,)},
            (
                r"spatial=8 cannot split vgg11's first layer conv1 \(36-row input\): a conv reads 36 "
                "rows, which do not divide over 8 devices"
            ),
        ),
        (
            {"model.name": "resnet50", "data.image_shape": (16, 16, 3), "mesh_shape": (8,)},
            "first layer stem .* its 7-row conv window reaches 3 rows past a band of 2",
        ),
    ],
)
def test_a_split_that_cannot_run_is_refused_in_one_line(overrides, message):
    config = tiny_config(
        **{"mesh_axes": ("spatial",), "num_devices": overrides["mesh_shape"][0], **overrides}
    )
    with pytest.raises(ConfigError, match=message) as info:
        run_setup.setup(config, jax.devices()[: config.num_devices])
    assert "\n" not in str(info.value)


def test_explain_states_where_the_maps_join():
    """VGG11 on 32x32 over 4 bands: conv6 (4 rows, a pool to 2) cannot split; its input is
    gathered and it and the rest run on the whole map, as the table says."""
    config = tiny_config(mesh_axes=("data", "spatial"), mesh_shape=(2, 4))
    text = explain.explain(config, jax.devices())
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith("  conv")}
    assert "bands" in rows["conv5"] and rows["conv5"].split()[1:4] == ["4", "1", "2"]
    assert "whole map, input gathered (a pool writes 2 rows" in rows["conv6"]
    assert "whole map" in rows["conv8"]
    assert "collective-permute   spatial" in text


def test_the_planner_enumerates_spatial_and_keeps_its_refusals():
    """The planner's space holds spatial meshes with every other axis, and the model's
    refusal prunes them: ResNet-50 at 16x16 cannot put its 7x7 stem on bands of 2 rows."""
    from jaxpar.plan import enumerate_candidates

    config = tiny_config(
        **{"model.name": "resnet50", "model.width": 1 / 16, "data.image_shape": (16, 16, 3)}
    )
    valid, refused = enumerate_candidates(config, 8, axes=("data", "spatial", "stage", "tensor"))
    spatial_sizes = {c.shape.get("spatial", 1) for c in valid}
    assert spatial_sizes == {1, 2, 4}
    assert any(c.shape.get("spatial") == 2 and c.shape.get("data") == 4 for c in valid)
    thin = [reason for c, reason in refused if c.shape.get("spatial") == 8]
    assert thin and all("past a band of 2" in reason for reason in thin)


def test_the_predictor_prices_each_halo_as_a_neighbour_message():
    """Every collective-permute over `spatial` is one point-to-point message on the link:
    its latency is paid per message and none of it hides under the compute (a halo is needed
    before its convolution can start)."""
    import dataclasses

    from jaxpar.predict.profiles import hardware
    from jaxpar.predict.programs.workload import workload
    from jaxpar.predict.step.model import predict_workload

    config = tiny_config(mesh_axes=("spatial",), mesh_shape=(4,), num_devices=4)
    w = workload(config)
    (chunk,) = w.chunks
    cols = chunk.collectives["step"]
    halos = [c for c in cols if c.kind == "collective-permute"]
    assert halos and all(c.axes == "spatial" for c in halos)
    count = sum(c.count for c in halos)
    assert count >= 2 * 6  # up and down, forward and backward, for every layer on bands
    without = dataclasses.replace(
        w,
        chunks=(
            dataclasses.replace(
                chunk,
                collectives={**chunk.collectives, "step": tuple(c for c in cols if c not in halos)},
            ),
        ),
    )
    latency = 1e-3
    profile = tiny_profile(intra=hardware.Link(1e18, latency))  # latency alone: 1 EB/s
    extra = predict_workload(w, profile).comm_s - predict_workload(without, profile).comm_s
    assert extra == pytest.approx(count * latency, rel=1e-6)
