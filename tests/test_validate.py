"""`python -m jaxpar.predict --validate` on a profile small enough to compile here: each model
left out is predicted from a fit on the others, and the report says whether the target is met."""

from __future__ import annotations

from jaxpar.predict import hardware, validate

# Three runs of two tiny models: fit on vgg11's two runs, predict resnet20, and back.
PROFILE = """
import ml_collections

def run(model, batch, rate):
    return {"model": model, "width": 0.0625, "batch_norm": False, "head": "auto",
            "image_shape": (32, 32, 3), "num_classes": 10, "dtype": "float32",
            "batch_size": batch, "images_per_sec": rate}

def get_config():
    c = ml_collections.ConfigDict()
    c.name = "tiny"
    c.num_devices = 1
    c.devices_per_node = 1
    c.peak_flops = {"float32": 1e11}
    c.memory_bytes = 1e9
    c.intra = {"bandwidth": 1e9, "latency": 1e-5, "rings": 1}
    c.kernel_s = 1e-5
    c.calibration_runs = [run("vgg11", 8, 800.0), run("vgg11", 16, 1400.0)]
    c.calibration_candidates = [run("resnet20", 8, 500.0)]
    c.fit = ("compute_efficiency",)
    return c
"""


def test_leave_one_model_out_report(tmp_path):
    path = tmp_path / "tiny.py"
    path.write_text(PROFILE)
    profile, fitted, candidates, names, suites = validate._spec(str(path))
    assert [r["model"] for r in fitted] == ["vgg11", "vgg11"] and suites == []
    loo = validate.leave_one_out(profile, fitted + candidates, names)
    by_model = {r["model"]: r for r in loo}
    # resnet20 predicted from the vgg11 fit alone: the same as fitting by hand
    fit = hardware.fit(profile, fitted, names).profile
    ops = validate.calibration_ops(candidates[0], fit.compiler)
    step = fit.program_time(ops, "float32") + fit.step_overhead_s + fit.program_overhead_s
    assert by_model["resnet20"]["predicted_images_per_sec"] == 8 / step
    assert by_model["resnet20"]["fitted_on"] == ["vgg11"]
    lines, figures = validate.report_profile(str(path))
    # two models: each left out in turn, the worst of them against the 15% target
    assert figures["single"] == max(abs(r["error"]) for r in loo)
    assert any("resnet20" in line for line in lines)


def test_measured_suites_report_how_far_their_repeats_agree():
    """A suite measured here that keeps each row's two repeats gets a line beside its median
    and ranking: the repeats' rank correlation and median difference over the rows predicted
    (a row that failed, here d, is left out), worked by hand."""
    spec = {"repeats": (("a", 100.0, 110.0), ("b", 200.0, 190.0), ("c", 300.0, 330.0),
                        ("d", 50.0, 40.0))}  # fmt: skip
    (line,) = validate._repeat_line(spec, ["a", "b", "c"])
    # ranks agree; |100/110 - 1| = |300/330 - 1| = 9.1% and |200/190 - 1| = 5.3%
    assert line == ("the measurement's own two repeats over 3 of these rows: rank correlation "
                    "1.00, median difference 9.1%")  # fmt: skip
    assert validate._repeat_line(spec, ["a", "b"]) == [] and validate._repeat_line({}, ["a"]) == []
