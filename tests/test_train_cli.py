"""The command line end to end: the metrics contract, and one-line errors."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = [
    "--config.num_train_steps=6",
    "--config.model.name=vgg11",
    "--config.model.width=0.0625",
    "--config.global_batch_size=16",
    "--config.log_every_steps=2",
    "--config.eval_every_steps=3",
    "--config.warmup_steps=1",
    "--config.data.num_train=256",
    "--config.data.num_eval=40",
]


def run_cli(*args, cwd=ROOT):
    return subprocess.run(
        [sys.executable, "-m", "jaxpar.train", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "PYTHONPATH": ROOT},
    )


def test_cli_run_writes_the_metrics_contract(tmp_path):
    workdir = tmp_path / "run"
    proc = run_cli("--config", "configs/vgg19_data.py", "--workdir", str(workdir), *TINY)
    assert proc.returncode == 0, proc.stderr[-3000:]
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


def test_cli_hybrid_pipeline_run_reports_the_bubble(tmp_path):
    """The main job's config ((2, 2, 2): data x stage x tensor, 1F1B) end to end, shrunk."""
    workdir = tmp_path / "hybrid"
    args = [a for a in TINY if "width" not in a] + ["--config.model.width=0.125"]
    proc = run_cli("--config", "configs/vgg19_hybrid.py", "--workdir", str(workdir), *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    s = records[-1]
    assert s["split"] == "summary" and s["strategy"] == "pipeline"
    assert s["mesh_shape"] == [2, 2, 2] and s["pipeline_schedule"] == "1f1b"
    assert s["analytic_bubble"] == pytest.approx(1 / (4 + 1))
    assert 0 < s["measured_bubble"] < 1
    assert s["bytes_between_stages_per_step"] > 0
    assert len(s["memory_per_device_bytes"]) == 2 and min(s["memory_per_device_bytes"]) > 0
    assert [r["step"] for r in records if r["split"] == "eval"] == [3, 6]
    assert "stage layers" in proc.stdout  # the per-stage table


def test_cli_default_workdir_is_printed(tmp_path):
    proc = run_cli(
        "--config",
        os.path.join(ROOT, "configs/vgg19_data.py"),
        *TINY[:1],
        "--config.num_train_steps=1",
        "--config.model.name=lenet",
        "--config.data.name=synthetic",
        "--config.data.image_shape=(28,28,1)",
        "--config.global_batch_size=8",
        "--config.data.num_eval=8",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "workdir: runs/vgg19_data-" in proc.stdout
    assert list((tmp_path / "runs").iterdir())


@pytest.mark.parametrize(
    "args,message",
    [
        (["--config.mesh_shape=(3,1,1)"], "error: mesh_shape (3, 1, 1) needs 3 devices"),
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
