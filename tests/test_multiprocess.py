"""Two processes on loopback (jax.distributed + gloo) compute what one process computes."""

import json
import os
import subprocess
import sys

import numpy as np

from tests.util import run_steps, tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_two_processes_match_one(tmp_path):
    steps = 3
    args = [
        "--config",
        "configs/vgg19_data.py",
        "--workdir",
        str(tmp_path),
        "--config.model.name=vgg11",
        "--config.model.width=0.0625",
        "--config.model.batch_norm=True",
        "--config.global_batch_size=16",
        f"--config.num_train_steps={steps}",
        "--config.log_every_steps=1",
        "--config.eval_every_steps=0",
        "--config.warmup_steps=0",
        "--config.lr_schedule=constant",
        "--config.data.name=synthetic",
        "--config.data.num_train=64",
        "--config.data.num_eval=20",
    ]
    proc = subprocess.run(
        [sys.executable, "launch/local.py", "--num_processes", "2", "--", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["split"] == "train"]
    summary = next(r for r in records if r["split"] == "summary")
    assert summary["num_devices"] == 8 and summary["mesh_shape"] == [8, 1, 1]
    # Only process 0 writes metrics, and both processes took part in each step.
    assert "[1]" in proc.stdout and len(losses) == steps

    config = tiny_config(**{"model.batch_norm": True, "mesh_shape": (8, 1, 1)})
    ref_losses, _ = run_steps(config, 8, steps)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
