"""A profile's calibration runs (a model, its input and batch size on one device; see
configs/hardware/dgx1_p100.py) as the predictor reads them: the experiment config of one
(`run_config`), its single-device step compiled once per process for the profile's GPU or a
CPU device (`calibration_workload`), and that step's op classes and FLOPs."""

from __future__ import annotations

import ml_collections

from jaxpar import axes, configfile
from jaxpar.predict.kernels import opclass
from jaxpar.predict.profiles.records import CalibrationRun
from jaxpar.predict.programs import gputarget
from jaxpar.predict.programs.workload import Workload, workload


def calibration_flops(run: CalibrationRun, target: gputarget.Target | None = None) -> float:
    """Matmul FLOPs (convolutions and dot products) of one single-device training step of a
    profile's calibration run, from the compiled step."""
    return calibration_ops(run, target).flops


# compiled once per run (less what it measured) and process
_CALIBRATION_RUNS: dict[tuple[CalibrationRun, str | None], Workload] = {}


def calibration_workload(run: CalibrationRun, target: gputarget.Target | None = None) -> Workload:
    """The single-device workload of a calibration run (a model, its input and batch size; see
    configs/hardware/dgx1_p100.py), compiled for one GPU of `target` or one CPU device. Loading
    a profile fits it to its runs, so each run's step is compiled once per process."""
    key = (run.identity(), target and target.gpu)
    if key not in _CALIBRATION_RUNS:
        _CALIBRATION_RUNS[key] = workload(run_config(run), 1, target and target.single())
    return _CALIBRATION_RUNS[key]


def calibration_ops(
    run: CalibrationRun, target: gputarget.Target | None = None
) -> opclass.OpClasses:
    """Op classes of one single-device training step of a calibration run, from its step
    compiled for `target`'s GPU (or a CPU device)."""
    (chunk,) = calibration_workload(run, target).chunks
    return chunk.op_classes("step")


def run_config(run: CalibrationRun) -> ml_collections.ConfigDict:
    """The 1-device experiment config of a calibration run, on synthetic data of its shape."""
    configfile.make_configs_importable()
    from configs import base

    config = base.get_config()
    config.model.name = run.model
    config.model.width = float(run.width)
    config.model.batch_norm = bool(run.batch_norm)
    config.model.dtype = run.dtype
    config.model.head = run.head
    config.data.name = "synthetic"
    config.data.image_shape = tuple(run.image_shape)
    config.data.num_classes = int(run.num_classes)
    config.global_batch_size = int(run.batch_size)
    config.mesh_axes = axes.DEFAULT
    config.mesh_shape = (1, 1, 1)
    return config
