"""A model's 2-D convolution layers as kernel-table rows (kernel_table.ConvRow), read from its
forward's jaxpr: the shapes --calibrate-here times beside DeepBench's (device_rates.own_shapes)
and benchmarks/conv_micro.py measures."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import jax

from jaxpar import models
from jaxpar.predict.kernels import kernel_table
from jaxpar.predict.profiles.calibration_runs import run_config
from jaxpar.predict.profiles.records import CalibrationRun


def model_rows(run: CalibrationRun) -> list[tuple[kernel_table.ConvRow, int]]:
    """Every 2-D convolution of a calibration run's model (model_runs.parse_row's run) as a
    kernel table's row (its `N` the run's batch), with how many layers of the model have that
    shape, in the order the forward first meets them: read from the forward's jaxpr, so any
    model of jaxpar's registry or a builder of one's own. Grouped or dilated convolutions,
    which the table cannot hold, are left out."""

    config = run_config(run)
    model = models.build(config.model, tuple(run.image_shape), int(run.num_classes))
    variables = model.variable_shapes()
    x = jax.ShapeDtypeStruct((int(run.batch_size), *run.image_shape), "float32")
    jaxpr = jax.make_jaxpr(
        lambda v, x: model.apply(v["params"], v["batch_stats"], x, train=True)[0]
    )(variables, x)
    counts: dict[tuple, int] = collections.Counter()
    for eqn in _equations(jaxpr.jaxpr):
        if eqn.primitive.name == "conv_general_dilated" and (key := _row_key(eqn)):
            counts[key] += 1
    return [(kernel_table.ConvRow(*key), n) for key, n in counts.items()]


def _equations(jaxpr):
    """Every equation of a jaxpr and of the jaxprs inside it (jit, remat, custom rules)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for inner in value if isinstance(value, list | tuple) else (value,):
                inner = getattr(inner, "jaxpr", inner)  # a ClosedJaxpr's jaxpr
                if hasattr(inner, "eqns"):
                    yield from _equations(inner)


@dataclasses.dataclass(frozen=True)
class ConvParams:
    """What a row takes of a conv_general_dilated equation's parameters."""

    feature_group_count: int
    batch_group_count: int
    padding: tuple  # (low, high) a spatial dimension
    window_strides: tuple
    dilations: tuple  # the input's and the window's, every dimension
    dimension_numbers: Any  # (batch, feature, spatial...), (out, in, spatial...)

    @classmethod
    def of_record(cls, params: dict[str, Any]) -> ConvParams:
        return cls(
            params["feature_group_count"],
            params["batch_group_count"],
            tuple(params["padding"]),
            tuple(params["window_strides"]),
            (*(params["lhs_dilation"] or ()), *(params["rhs_dilation"] or ())),
            params["dimension_numbers"],
        )


def _row_key(eqn) -> tuple | None:
    """A 2-D convolution equation as (W, H, C, N, K, R, S, pad_h, pad_w, stride_h, stride_w),
    an uneven padding (SAME on an even window) read as its smaller side; None for a grouped
    or dilated one, or one of other than two spatial dimensions."""
    p = ConvParams.of_record(eqn.params)
    if (
        p.feature_group_count != 1
        or p.batch_group_count != 1
        or len(p.padding) != 2
        or any(d != 1 for d in p.dilations)
    ):
        return None
    lhs, rhs = (v.aval.shape for v in eqn.invars[:2])
    dims = p.dimension_numbers
    n, c = lhs[dims.lhs_spec[0]], lhs[dims.lhs_spec[1]]
    h, w = (lhs[d] for d in dims.lhs_spec[2:])
    k = rhs[dims.rhs_spec[0]]
    r, s = (rhs[d] for d in dims.rhs_spec[2:])
    (ph, pw), (sh, sw) = (min(pad) for pad in p.padding), p.window_strides
    return (w, h, c, n, k, r, s, ph, pw, sh, sw)
