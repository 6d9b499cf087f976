"""The command line end to end: the metrics contract, and one-line errors."""

import io
import json
import math
import os
import re

import pytest

from tests.util import ROOT, SHORT_RUN, run_cli


def test_cli_run_writes_the_metrics_contract(tmp_path):
    """A run of a shipped config without --workdir (from another directory): it says where it
    writes (runs/<config>-<time>, in the current directory), and writes there the metrics
    every run writes."""
    from jaxpar import events

    proc = run_cli(
        "--config", os.path.join(ROOT, "configs/vgg19_data.py"), *SHORT_RUN, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = re.search(r"^workdir: (runs/vgg19_data-\S+)", proc.stdout, re.MULTILINE)
    assert printed, proc.stdout[:2000]
    workdir = tmp_path / printed.group(1)
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [workdir.name]
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    evals = [r for r in records if r["split"] == "eval"]
    summary = [r for r in records if r["split"] == "summary"]
    assert [r["step"] for r in train] == [2, 4, 6]
    # SHORT_RUN's schedule at steps 1, 3, 5 (0-based: each line's last step trained with it):
    # a linear warmup over step 0 to 0.05, then a cosine from 0.05 at step 1 to 0 at step 6,
    # 0, 2/5 and 4/5 of the way (float32)
    lrs = [0.05 * (1 + math.cos(math.pi * t)) / 2 for t in (0, 2 / 5, 4 / 5)]
    assert [r["learning_rate"] for r in train] == pytest.approx(lrs, rel=1e-6)
    assert [r["step"] for r in evals] == [3, 6]
    for r in evals:  # the 40 images of the eval split: accuracy is some k/40
        assert r["count"] == 40 and r["accuracy"] * 40 == pytest.approx(round(r["accuracy"] * 40))
    assert len(summary) == 1 and records[-1]["split"] == "summary"
    s = summary[0]
    assert s["num_devices"] == 8 and s["mesh_shape"] == [8, 1, 1]
    assert (s["steps"], s["global_batch_size"], s["train_examples"]) == (6, 16, 256)
    assert s["epochs"] == 6 * 16 / 256
    # A step time is the gap between two step ends with nothing off the clock between: 1 -> 2
    # and 4 -> 5 (the evaluations after steps 3 and 6 stop the clock). Fewer than the 3
    # warm-up steps to leave out, so both count: 16 images per median step.
    assert s["timed_steps"] == 2
    assert s["step_time_p10_s"] <= s["step_time_median_s"] <= s["step_time_p90_s"]
    assert s["images_per_sec"] == pytest.approx(16 / s["step_time_median_s"], rel=1e-12)
    assert s["seconds_per_epoch"] == pytest.approx(256 / s["images_per_sec"], rel=1e-12)
    flops = s["images_per_sec"] * s["model_flops_per_image"] / 1e12
    assert s["model_tflops_per_sec"] == pytest.approx(flops, rel=1e-12)
    assert s["compile_time_s"] < s["wall_time_s"]  # compiling is part of the run
    # VGG11 at 1/16 width on 32x32x3, BatchNorm: 3x3 convs of 4, 8, 16, 16, 32, 32, 32, 32
    # channels (kernels 36,108 + biases 172 + BatchNorm scale and bias 344), then 32 -> 10
    # (330); every device holds it all in float32, and as much again in SGD's momentum beside
    # the learning-rate schedule's int32 step count
    assert s["num_params"] == 36_954
    assert s["param_bytes_per_device"] == 4 * 36_954
    assert s["opt_state_bytes_per_device"] == 4 * 36_954 + 4
    assert s["final_loss"] == train[-1]["loss"] and s["eval_loss"] == evals[-1]["loss"]
    assert s["eval_accuracy"] == evals[-1]["accuracy"]
    # TensorBoard shows the same numbers (as float32) at the same steps
    scalars = events.read_scalars(str(workdir / "tensorboard"))
    shown = {
        "train": ("loss", "accuracy", "learning_rate", "images_per_sec"),
        "eval": ("loss", "accuracy", "count"),
    }
    for split, rows in (("train", train), ("eval", evals)):
        for key in shown[split]:
            got = scalars[f"{split}/{key}"]
            assert [step for step, _ in got] == [r["step"] for r in rows], key
            assert [v for _, v in got] == pytest.approx([r[key] for r in rows], rel=1e-6), key
    assert "ETA" in proc.stdout and "images/sec" in proc.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["--config.mesh_shape=(3,1,1)"],
            "error: mesh (data=3, stage=1, tensor=1) needs 3 devices",
        ),
        (["--config.global_batch_size=12"], "error: global_batch_size 12 is not divisible"),
        (["--config.data.name=cifar10", "--config.data.data_dir=/nonexistent"], "shapes10"),
    ],
)
def test_cli_bad_input_is_one_line(tmp_path, args, message):
    proc = run_cli("--config", "configs/vgg19_data.py", "--workdir", str(tmp_path), *args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert message in lines[-1]
    assert not any("Traceback" in line for line in lines)


def test_cli_misspelt_key_fails_at_once(tmp_path):
    proc = run_cli("--config", "configs/vgg19_data.py", "--config.global_batchsize=8")
    assert proc.returncode != 0
    assert "global_batchsize" in proc.stderr


def test_numbers_print_in_one_format_each():
    """Durations, learning rates and meshes read the same wherever they print; a summary read
    back from metrics.jsonl (a finished run's) shows its mesh as configs write it."""
    from jaxpar import console, metrics, units
    from jaxpar.summary_record import RunSummary

    assert [units.seconds(t) for t in (6.0299, 0.5843, 0.00095, 5.2e-05, 0.9997, 1234.5)] == [
        "6.03 s",
        "584 ms",
        "950 us",
        "52.0 us",
        "1.00 s",
        "1,234 s",
    ]
    # elapsed times and ETAs: the console, the bench, the planner
    assert [units.clock(t) for t in (7.4, 247.0, 3723.0, float("inf"))] == [
        "00:07",
        "04:07",
        "1:02:03",
        "--:--",
    ]
    assert [units.rate(x) for x in (0.05, 0.00095, 5.2e-05)] == ["5.00e-02", "9.50e-04", "5.20e-05"]
    summary = RunSummary.of_record(  # as metrics.jsonl holds it
        json.loads(
            json.dumps(
                metrics.summary(
                    strategy="data",
                    mesh_shape=(8, 1, 1),
                    partitioning="data parallel over 8",
                    steps=4,
                    global_batch_size=16,
                    step_times=[0.5, 0.25],
                    warmup=0,
                    compile_time_s=6.0299,
                    wall_time_s=9.5,
                    train={"loss": 2.3},
                    evaluation={},
                    num_params=10,
                    flops_per_example=1.0,
                    report=None,
                    made=[(0.00095, 0.0001)] * 2,
                    waited=[5.2e-05] * 2,
                ).as_record()
            )
        )
    )
    rows = dict(
        line.rsplit("  ", 1)
        for line in console.summary_table(summary).splitlines()
        if "  " in line and not line.startswith("-")
    )
    rows = {k.strip(): v.strip() for k, v in rows.items()}
    assert rows["mesh"] == "(data=8, stage=1, tensor=1)"
    assert rows["partitioning"] == "data parallel over 8"
    assert rows["compile time"] == "6.03 s" and rows["step time, median"] == "375 ms"
    assert rows["wait for data / step, mean"] == "52.0 us"
    assert rows["host batch time, median"] == "1.05 ms"
    line = console.Progress(4, stream=io.StringIO()).update(2, loss=2.3, lr=units.rate(5e-4))
    assert "lr 5.00e-04" in line
