"""Orbax checkpoints: exact resume after a kill, SIGTERM, restore across meshes, bad input."""

import json
import os
import random
import signal

import jax
import numpy as np
import pytest

from jaxpar import checkpoint, configfile, trainer
from jaxpar import config as config_lib
from tests.util import (
    max_rel_error,
    run_steps,
    start_cli,
    tiny_config,
    train_losses,
    wait_for_step,
)

ARGS = [
    "--config", "configs/vgg19_data.py", "--config.model.name=vgg11",
    "--config.model.width=0.0625", "--config.global_batch_size=16",
    "--config.num_train_steps=12", "--config.log_every_steps=1", "--config.eval_every_steps=0",
    "--config.data.num_train=256", "--config.data.num_eval=32", "--config.warmup_steps=2",
    "--config.checkpoint_every_steps=2",
]  # fmt: skip


def final_params(workdir, config):
    s = trainer.setup(config, jax.devices())
    ckpt = checkpoint.Checkpointer(str(workdir), config, s.model, 2, 3)
    state, step = ckpt.restore(s.strategy.host_target())
    ckpt.close()
    return state.params, step


def start(workdir):
    return start_cli(*ARGS, "--workdir", str(workdir))


def test_kill_and_sigterm_resume_exactly(tmp_path):
    """One run of the command line stopped twice: SIGKILL at a random step, the same command
    again, SIGTERM (save and exit cleanly), the same command again. Every step's loss and the
    final parameters are those of the uninterrupted run, bit for bit (run in this process: the
    same programs on the same 8 devices, while the last command runs)."""
    # SIGKILL at a random step, then the same command again. Saves run every 2 steps and a
    # save waits for the previous one to finish, so from step 5 on a complete checkpoint
    # exists (an earlier kill would rightly restart from scratch).
    run = tmp_path / "run"
    proc = start(run)
    wait_for_step(proc, random.Random(os.getpid()).randint(5, 7))
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    # SIGTERM to the resumed run: it saves, exits cleanly, and the next run resumes there.
    proc = start(run)
    out = wait_for_step(proc, 9)
    proc.send_signal(signal.SIGTERM)
    out += proc.stdout.read()
    assert proc.wait(timeout=120) == 0, out[-2000:]
    assert "resumed from the checkpoint of step" in out
    assert "SIGTERM: saved the checkpoint of step" in out
    saved = sorted(int(d) for d in os.listdir(run / "checkpoints") if d.isdigit())
    assert saved and saved[-1] >= 9
    proc = start(run)
    overrides, rest = configfile.split_overrides(ARGS)
    config = configfile.override(configfile.load(rest[rest.index("--config") + 1]), overrides)
    ref = tmp_path / "ref"
    trainer.train_and_evaluate(config, str(ref))
    out = proc.stdout.read()
    assert proc.wait(timeout=600) == 0, out[-2000:]
    assert f"resumed from the checkpoint of step {saved[-1]}" in out

    expected = train_losses(ref)
    assert len(expected) == 12
    assert train_losses(run) == expected  # bit-identical, one line per step
    params, step = final_params(run, config)
    assert step == 12
    ref_params, _ = final_params(ref, config)
    jax.tree.map(np.testing.assert_array_equal, params, ref_params)


def cross_config(mesh_shape, steps=4):
    return tiny_config(**{"model.width": 0.125, "mesh_shape": mesh_shape, "num_train_steps": steps,
                          "checkpoint_every_steps": 2, "pipeline.schedule": "1f1b",
                          "pipeline.num_microbatches": 2})  # fmt: skip


@pytest.fixture(scope="module")
def one_device():
    """cross_config's 4 steps on one device: losses and final state."""
    return run_steps(cross_config((1, 1, 1)), 1, 4)


@pytest.mark.parametrize(
    "before,after,devices_after",
    [((8, 1, 1), (1, 4, 2), 8), ((2, 2, 2), (1, 1, 1), 1), ((1, 8, 1), (4, 1, 2), 8)],
)
def test_restore_across_meshes(tmp_path, capsys, one_device, before, after, devices_after):
    """Steps 1-2 on one mesh, 3-4 from its checkpoint on another: the 4 steps of one device."""
    ref_losses, ref_state = one_device
    moved = str(tmp_path / "moved")
    trainer.train_and_evaluate(cross_config(before, steps=2), moved)
    result = trainer.train_and_evaluate(cross_config(after), moved, jax.devices()[:devices_after])
    assert "resumed from the checkpoint of step 2" in capsys.readouterr().out
    losses = train_losses(moved)
    assert len(losses) == 4
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    assert max_rel_error(result["state"].params, ref_state.params) < 1e-5


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
