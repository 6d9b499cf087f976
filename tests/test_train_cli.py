"""The command line end to end: the metrics contract, and one-line errors."""

import io
import json
import os
import re

import pytest

from tests.util import ROOT, SHORT_RUN, run_cli


def test_cli_run_writes_the_metrics_contract(tmp_path):
    """A run of a shipped config without --workdir (from another directory): it says where it
    writes (runs/<config>-<time>, in the current directory), and writes there the metrics
    every run writes."""
    proc = run_cli("--config", os.path.join(ROOT, "configs/vgg19_data.py"), *SHORT_RUN,
                   cwd=tmp_path)  # fmt: skip
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
    for r in train:
        assert {"loss", "learning_rate", "images_per_sec"} <= set(r)
        assert r["images_per_sec"] > 0 and r["loss"] > 0
    assert [r["step"] for r in evals] == [3, 6]
    assert all(0.0 <= r["accuracy"] <= 1.0 and r["loss"] > 0 for r in evals)
    assert len(summary) == 1 and records[-1]["split"] == "summary"
    s = summary[0]
    for key in ("images_per_sec", "step_time_median_s", "compile_time_s", "final_loss"):
        assert s[key] > 0, key
    assert s["num_devices"] == 8 and s["mesh_shape"] == [8, 1, 1]
    assert s["final_loss"] == pytest.approx(train[-1]["loss"])
    assert list((workdir / "tensorboard").iterdir())  # TensorBoard event files exist
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
    from jaxpar import metrics, units

    assert [units.seconds(t) for t in (6.0299, 0.5843, 0.00095, 5.2e-05, 0.9997, 1234.5)] == [
        "6.03 s", "584 ms", "950 us", "52.0 us", "1.00 s", "1,234 s"
    ]  # fmt: skip
    assert [units.rate(x) for x in (0.05, 0.00095, 5.2e-05)] == [
        "5.00e-02", "9.50e-04", "5.20e-05"
    ]  # fmt: skip
    summary = json.loads(json.dumps(metrics.summary(
        strategy="data", mesh_shape=(8, 1, 1), partitioning="data parallel over 8", steps=4,
        global_batch_size=16, step_times=[0.5, 0.25], warmup=0, compile_time_s=6.0299,
        wall_time_s=9.5, train={"loss": 2.3}, evaluation={}, num_params=10,
        flops_per_example=1.0, report={}, made=[(0.00095, 0.0001)] * 2, waited=[5.2e-05] * 2,
    )))  # fmt: skip
    rows = dict(line.rsplit("  ", 1) for line in metrics.summary_table(summary).splitlines()
                if "  " in line and not line.startswith("-"))  # fmt: skip
    rows = {k.strip(): v.strip() for k, v in rows.items()}
    assert rows["mesh"] == "(data=8, stage=1, tensor=1)"
    assert rows["partitioning"] == "data parallel over 8"
    assert rows["compile time"] == "6.03 s" and rows["step time, median"] == "375 ms"
    assert rows["wait for data / step, mean"] == "52.0 us"
    assert rows["host batch time, median"] == "1.05 ms"
    line = metrics.Progress(4, stream=io.StringIO()).update(2, loss=2.3, lr=units.rate(5e-4))
    assert "lr 5.00e-04" in line
