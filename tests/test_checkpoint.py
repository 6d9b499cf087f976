"""Orbax checkpoints: exact resume after a kill, SIGTERM, restore across meshes, bad input."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest

from jaxpar import checkpoint, trainer
from jaxpar import config as config_lib
from tests.util import tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARGS = [
    "--config", "configs/vgg19_data.py", "--config.model.name=vgg11",
    "--config.model.width=0.0625", "--config.global_batch_size=16",
    "--config.num_train_steps=12", "--config.log_every_steps=1", "--config.eval_every_steps=0",
    "--config.data.num_train=256", "--config.data.num_eval=32", "--config.warmup_steps=2",
    "--config.checkpoint_every_steps=2",
]  # fmt: skip
ENV = {**os.environ, "PYTHONPATH": ROOT}


def train_losses(workdir) -> list[float]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    return [r["loss"] for r in records if r["split"] == "train"]


def final_params(workdir, config):
    s = trainer.setup(config, jax.devices())
    ckpt = checkpoint.Checkpointer(str(workdir), config, s.model, 2, 3)
    state, step = ckpt.restore(s.strategy.host_target())
    ckpt.close()
    return state.params, step


def start(workdir):
    return subprocess.Popen(
        [sys.executable, "-u", "-m", "jaxpar.train", *ARGS, "--workdir", str(workdir)],
        cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def run_until(proc, step: int) -> None:
    for line in proc.stdout:
        if line.startswith(f"step {step:>2}/12"):
            return
    raise AssertionError("the run ended before the step")


def test_kill_and_sigterm_resume_exactly(tmp_path):
    ref = tmp_path / "ref"
    proc = start(ref)
    assert proc.wait(timeout=600) == 0, proc.stdout.read()[-2000:]

    # SIGKILL at a random step, then the same command again. Saves run every 2 steps and a
    # save waits for the previous one to finish, so from step 5 on a complete checkpoint
    # exists (an earlier kill would rightly restart from scratch).
    killed = tmp_path / "killed"
    proc = start(killed)
    run_until(proc, random.Random(os.getpid()).randint(5, 9))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc = start(killed)
    out = proc.stdout.read()
    assert proc.wait(timeout=600) == 0, out[-2000:]
    assert "resumed from the checkpoint of step" in out

    # SIGTERM: save, exit cleanly, and resume.
    termed = tmp_path / "termed"
    proc = start(termed)
    run_until(proc, 5)
    proc.send_signal(signal.SIGTERM)
    out = proc.stdout.read()
    assert proc.wait(timeout=120) == 0
    assert "SIGTERM: saved the checkpoint of step" in out
    saved = sorted(int(d) for d in os.listdir(termed / "checkpoints") if d.isdigit())
    assert saved and saved[-1] >= 5
    proc = start(termed)
    assert proc.wait(timeout=600) == 0

    expected = train_losses(ref)
    assert len(expected) == 12
    for workdir in (killed, termed):
        assert train_losses(workdir) == expected  # bit-identical, one line per step
    config = _cli_config()
    ref_params, _ = final_params(ref, config)
    for workdir in (killed, termed):
        params, step = final_params(workdir, config)
        assert step == 12
        jax.tree.map(np.testing.assert_array_equal, params, ref_params)


def _cli_config():
    """The model and optimizer of ARGS, to read its checkpoints back."""
    return tiny_config(**{"model.width": 0.0625, "model.batch_norm": True,
                          "data.name": "shapes10", "data.num_train": 256})  # fmt: skip


def cross_config(mesh_shape, steps=4):
    return tiny_config(**{"model.width": 0.125, "mesh_shape": mesh_shape, "num_train_steps": steps,
                          "checkpoint_every_steps": 2, "pipeline.schedule": "1f1b",
                          "pipeline.num_microbatches": 2})  # fmt: skip


@pytest.mark.parametrize(
    "before,after,devices_after",
    [((8, 1, 1), (1, 4, 2), 8), ((2, 2, 2), (1, 1, 1), 1), ((1, 8, 1), (4, 1, 2), 8)],
)
def test_restore_across_meshes(tmp_path, before, after, devices_after):
    ref = trainer.train_and_evaluate(cross_config(before), str(tmp_path / "ref"))
    assert ref["steps"] == 4
    ref_losses = train_losses(tmp_path / "ref")
    moved = tmp_path / "moved"
    trainer.train_and_evaluate(cross_config(before), str(moved))
    shutil.rmtree(moved / "checkpoints" / "4")  # as if stopped after step 2
    trainer.train_and_evaluate(cross_config(after), str(moved), jax.devices()[:devices_after])
    losses = train_losses(moved)
    assert len(losses) == 4
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)


def test_corrupt_newest_checkpoint_falls_back(tmp_path, caplog):
    config = cross_config((8, 1, 1))
    trainer.train_and_evaluate(config, str(tmp_path))
    newest = tmp_path / "checkpoints" / "4"
    for root, _, files in os.walk(newest):
        for name in files:
            with open(os.path.join(root, name), "wb") as f:
                f.write(b"garbage")
    s = trainer.setup(config, jax.devices())
    ckpt = checkpoint.Checkpointer(str(tmp_path), config, s.model, 2, 3)
    _, step = ckpt.restore(s.strategy.host_target())
    ckpt.close()
    assert step == 2 and newest.exists()
    assert "trying an older one" in caplog.text


def test_incompatible_checkpoint_is_one_line_error(tmp_path):
    trainer.train_and_evaluate(cross_config((8, 1, 1)), str(tmp_path))
    wider = cross_config((8, 1, 1))
    wider.model.width = 0.25
    with pytest.raises(config_lib.ConfigError) as info:
        trainer.train_and_evaluate(wider, str(tmp_path))
    message = str(info.value)
    assert "was written for width=0.125, this config has width=0.25" in message
    assert "\n" not in message


def test_continuing_a_finished_run_keeps_its_learning_rate_schedule(tmp_path):
    """A finished 4-step cosine run continued to 6 steps: refused in one line (the rates of
    steps 5-6 would follow a stretched schedule), then run with the old schedule kept: steps
    1-4 keep their rates and steps 5-6 run at the schedule's end value."""
    settings = {"lr_schedule": "cosine", "warmup_steps": 1, "checkpoint_every_steps": 2}
    workdir = str(tmp_path / "run")
    trainer.train_and_evaluate(tiny_config(**settings, num_train_steps=4), workdir)

    def rates():
        with open(os.path.join(workdir, "metrics.jsonl")) as f:
            lines = [json.loads(line) for line in f]
        return {r["step"]: r["learning_rate"] for r in lines if r["split"] == "train"}

    before = rates()
    with pytest.raises(config_lib.ConfigError) as refused:
        trainer.train_and_evaluate(tiny_config(**settings, num_train_steps=6), workdir)
    message = str(refused.value)
    assert "trained on a 4-step cosine learning-rate schedule" in message
    assert "--config.schedule_steps=4" in message and "\n" not in message
    assert rates() == before  # nothing was written

    kept = tiny_config(**settings, num_train_steps=6, schedule_steps=4)
    trainer.train_and_evaluate(kept, workdir)
    after = rates()
    assert {step: after[step] for step in before} == before
    assert before[4] > 0 and after[5] == after[6] == 0.0
