"""`python -m jaxpar.predict --validate` on a profile small enough to compile here: each model
left out is predicted from a fit on the others, and the report says whether the target is met."""

from __future__ import annotations

import math

import pytest

from jaxpar.predict import PredictedRow, Reference, Scaling
from jaxpar.predict.validation import report, suite_checks

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


def _table(lines: list[str]) -> dict[tuple[str, int], list[str]]:
    """The report's rows by (model, batch): measured, predicted, error, baseline, fitted on."""
    rows = [line.strip("| ").split(" | ") for line in lines if line.startswith("| ")]
    return {(r[0], int(r[2])): r[3:] for r in rows if r[0] in ("vgg11", "resnet20")}


def test_leave_one_model_out_report(tmp_path):
    """Each model is predicted from a fit on the other alone, so resnet20's prediction does
    not move when its own measured rate does (500 or 5000 img/s). The baseline, every row at
    the median rate of the rows fitted on, worked by hand: resnet20 at vgg11's (800 + 1400)
    / 2 = 1100 img/s, +120.0% of its 500 (-78.0% of 5000); vgg11 at resnet20's 500, -37.5% of
    800 and -64.3% of 1400 (at 5000: +525.0% and +257.1%)."""
    tables = {}
    for rate, baseline in ((500.0, "+120.0%"), (5000.0, "-78.0%")):
        path = tmp_path / f"tiny{rate:.0f}.py"
        path.write_text(PROFILE.replace("500.0", str(rate)))
        lines, figures = report.report_profile(str(path))
        held = next(i for i, line in enumerate(lines) if "held out (never fitted)" in line)
        assert [line[:11] for line in lines[held:] if line.startswith("| ")] == ["| resnet20 "]
        tables[rate] = table = _table(lines)
        assert table[("resnet20", 8)][-2:] == [baseline, "vgg11"]
        errors = [abs(float(r[2].rstrip("%"))) for r in table.values()]
        assert 100 * figures.single == pytest.approx(max(errors), abs=0.05)  # the worst
    assert [r[-2:] for k, r in tables[500.0].items() if k[0] == "vgg11"] == [
        ["-37.5%", "resnet20"],
        ["-64.3%", "resnet20"],
    ]
    assert [r[-2] for k, r in tables[5000.0].items() if k[0] == "vgg11"] == ["+525.0%", "+257.1%"]
    assert tables[500.0][("resnet20", 8)][1] == tables[5000.0][("resnet20", 8)][1]


def test_validate_cli_prints_each_profile_as_it_goes(tmp_path, capsys):
    """`--validate` keeps stdout for the report (each profile's part, then the summary) and
    says on stderr what it is doing, model by model: every profile takes minutes."""
    from jaxpar.predict import __main__ as cli

    path = tmp_path / "tiny.py"
    path.write_text(PROFILE)
    assert cli.main(["--validate", "--profile", str(path), "--out", str(tmp_path / "o")]) == 0
    out, err = capsys.readouterr()
    assert out.index("| left out |") < out.index("## Summary") and "| tiny.py | " in out
    assert out.strip() == (tmp_path / "o" / "validation.md").read_text().strip()
    said = err.splitlines()
    assert said[0].startswith(f"validating 1/1: {path}; elapsed ")
    assert said[1].startswith("leave-one-out 1/2: fitting without resnet20; elapsed ")
    assert said[2].startswith("leave-one-out 2/2: fitting without vgg11; elapsed ")
    # a profile that is not there: one line, before minutes are spent on the others
    assert cli.main(["--validate", "--profile", str(path), "--profile", "nope.py"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: no hardware profile 'nope.py'; choose one of ")
    assert err.count("\n") == 1


def test_measured_suites_report_how_far_their_repeats_agree():
    """A suite measured here that keeps each row's two repeats gets a line beside its median
    and ranking: the repeats' rank correlation and median difference over the rows predicted
    (a row that failed, here d, is left out), worked by hand."""
    spec = {
        "repeats": (
            ("a", 100.0, 110.0),
            ("b", 200.0, 190.0),
            ("c", 300.0, 330.0),
            ("d", 50.0, 40.0),
        )
    }
    (line,) = suite_checks.repeat_line(spec, ["a", "b", "c"])
    # ranks agree; |100/110 - 1| = |300/330 - 1| = 9.1% and |200/190 - 1| = 5.3%
    assert line == (
        "the measurement's own two repeats over 3 of these rows: rank correlation "
        "1.00, median difference 9.1%"
    )
    assert suite_checks.repeat_line(spec, ["a", "b"]) == []
    assert suite_checks.repeat_line({}, ["a"]) == []


def test_published_tables_give_each_row_its_model_s_efficiency():
    """tf_cnn_benchmarks' DGX-1 table as a suite: five models on 1-8 GPUs at their own batch
    per GPU (AlexNet 512), each multi-GPU row's reference efficiency against its own model's
    1-GPU figure: AlexNet's 17,822 on 8 GPUs over 8 x 2,987 is 74.6%."""
    from jaxpar.predict import with_references
    from jaxpar.suites import load_rows

    rows = load_rows(None, "configs/predict/dgx1_tf_cnn_benchmarks.py", {})
    assert len(rows) == 20
    by_name = {name: (config, ref) for name, config, ref in rows}
    config, ref = by_name["alexnet data 8"]
    assert ref.images_per_sec == 17822.0 and config.global_batch_size == 8 * 512
    assert tuple(config.mesh_shape) == (8, 1, 1) and not config.model.batch_norm
    assert tuple(by_name["inception_v3 data 1"][0].data.image_shape) == (299, 299, 3)
    predicted = [
        PredictedRow(status="ok", model=config.model.name, num_devices=math.prod(config.mesh_shape))
        for _, config, _ in rows
    ]
    predicted = with_references(predicted, [ref for _, _, ref in rows])
    eight = predicted[[name for name, _, _ in rows].index("alexnet data 8")]
    assert eight.reference_efficiency == 17822 / (8 * 2987)


def test_a_published_table_reports_its_worst_row_and_how_many_meet(tmp_path, monkeypatch):
    """Each published table: its worst efficiency difference against the 5-point target and
    how many of its multi-device rows are within it (1-device rows are the baselines)."""
    suite = tmp_path / "table.py"
    suite.write_text(
        "import ml_collections\n\ndef get_config():\n    return ml_collections.ConfigDict()\n"
    )
    rows = [
        PredictedRow(
            name=f"m data {n}",
            status="ok",
            num_devices=n,
            images_per_sec=100.0 * n,
            scaling=Scaling(None, eff),
            reference=Reference(None, ref),
        )
        for n, eff, ref in ((1, 1.0, 1.0), (2, 0.95, 0.97), (4, 0.9, 0.98), (8, 0.9, 0.88))
    ]
    monkeypatch.setattr(suite_checks, "suite_rows", lambda path, suite, say=None: rows)
    lines, figures = suite_checks.suite_lines("profile.py", str(suite), suite_checks.Figures())
    # -2, -8 and +2 points: the worst 8.0, two of three within 5
    assert figures.points == pytest.approx(8.0)
    assert lines[-1] == (
        "\nworst efficiency difference: 8.0 points (MISSES the 5-point target);"
        " 2 of 3 multi-device rows within 5 points"
    )


def test_tables_of_the_same_runs_are_predicted_once(monkeypatch):
    """GCE's and AWS's K80 tables hold the same 20 runs: --validate predicts them once."""

    calls = []

    def fake(config, profile, overlap):
        calls.append(config.model.name)
        return PredictedRow(status="ok", model=config.model.name, num_devices=1, images_per_sec=1.0)

    monkeypatch.setattr(suite_checks, "predict_config", fake)
    monkeypatch.setattr(suite_checks, "load_profile", lambda path: object())
    suite_checks.forget()
    said = []
    gce = suite_checks.suite_rows(
        "k80.py", "configs/predict/k80_gce_tf_cnn_benchmarks.py", said.append
    )
    assert len(said) == 20 and said[0].startswith("predicted 1/20 ") and "1.0 img/s" in said[0]
    assert ", ETA " in said[-1]
    aws = suite_checks.suite_rows("k80.py", "configs/predict/k80_aws_tf_cnn_benchmarks.py")
    assert len(gce) == len(aws) == 20 and len(calls) == 20
    assert aws[-1].reference_images_per_sec == 260.0  # each table keeps its own figures
    suite_checks.forget()
