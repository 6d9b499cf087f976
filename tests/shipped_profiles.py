"""The shipped profiles' fitted figures as `python -m jaxpar.predict` gets them, for
tests/test_perfmodel.py:

    python -m tests.shipped_profiles OUT.json

Fitting a profile compiles its calibration runs' steps and reads their programs, so its costs
depend on how XLA:CPU compiles; the suite compiles with XLA:CPU's older fusion emitters
(tests/conftest.py: faster), under which the programs, and so the fits, differ by a few per
cent. This runs in a process of its own with XLA:CPU's defaults (tests.util.default_compiler_env)
and writes, for every profile, its 1 GB all-reduce time and its costs; and, with the DGX-1's
profile, its VGG16 row predicted as tests/test_perfmodel.py's calibration test reads it. With a second path,

    python -m tests.shipped_profiles OUT.json HELD_OUT.json

it also writes there what tests/test_perfmodel.py's leave-one-out test of the H100 fit reads:
h100_sxm_x8.py fitted to three of its four runs, and its prediction of the fourth, from the
programs this process compiled for the profile's own fit.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from jaxpar import configfile


def profile_figures(path: Path) -> dict:
    """One profile's costs as it loads (fitted where its file says so) and its 1 GB all-reduce
    time."""
    from jaxpar.predict import load_profile
    from jaxpar.predict.comm import links
    from jaxpar.predict.profiles import hardware

    p = load_profile(path)
    costs = {
        name: value
        for name, value in hardware.fields(p).items()
        if isinstance(value, int | float) or name == "overlap"
    }
    costs["allreduce"] = links.collective_time(
        "all-reduce", 1e9, list(range(p.device.num_devices)), p
    )
    return costs


def main(out: str, names: list[str] | None = None) -> None:
    from configs import base
    from configs.predict import dgx1_vgg16
    from jaxpar.predict import load_profile, predict_config
    from tests.util import override

    figures = {}
    for path in sorted(Path("configs/hardware").glob("*.py")):
        if names is None or path.stem in names:
            figures[path.stem] = profile_figures(path)
    if "dgx1_p100" in figures:
        suite = dgx1_vgg16.get_config()
        config = override(base.get_config(), {**suite.overrides, **suite.rows[0]["config"]})
        row = predict_config(config, load_profile("configs/hardware/dgx1_p100.py"))
        figures["dgx1_vgg16_images_per_sec"] = row.images_per_sec
    with open(out, "w") as f:
        json.dump(figures, f)


# The H100 run the leave-one-out test holds out: bfloat16 at batch 128, launch-bound
HELD = ("bfloat16", 128)


def held_out(out: str) -> None:
    """h100_sxm_x8.py fitted to its runs but HELD: the held run's measured and predicted
    images/sec (a step: its program, and the host's fixed costs around it)."""
    from jaxpar.predict import load_profile
    from jaxpar.predict.profiles import fitting
    from jaxpar.predict.profiles.calibration_runs import calibration_ops
    from jaxpar.predict.profiles.records import CalibrationRun
    from jaxpar.predict.programs import gputarget
    from jaxpar.predict.step import pricing

    path = "configs/hardware/h100_sxm_x8.py"
    c = configfile.load(path)
    runs = [CalibrationRun.of_record(r) for r in c.calibration_runs]
    (held,) = [r for r in runs if (r.dtype, r.batch_size) == HELD]
    p = fitting.fit(load_profile(path), [r for r in runs if r is not held], tuple(c.fit)).profile
    step = pricing.program_time(p, calibration_ops(held, gputarget.of(p)), held.dtype)
    step += p.host.step_overhead_s + p.host.program_overhead_s
    with open(out, "w") as f:
        json.dump(
            {
                "measured_images_per_sec": held.images_per_sec,
                "images_per_sec": held.batch_size / step,
            },
            f,
        )


if __name__ == "__main__":
    configfile.set_host_device_count(8, replace=True)
    configfile.cpu_only()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("held_out", nargs="?")
    parser.add_argument("--profiles", nargs="+", help="these profiles (file stems) alone")
    args = parser.parse_args()
    main(args.out, args.profiles)
    if args.held_out:
        held_out(args.held_out)
