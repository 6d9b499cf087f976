"""Chaos: one run of the command line killed (SIGKILL), stopped (SIGTERM), its newest checkpoint
corrupted, and continued, over and over; at the end it is the uninterrupted run, bit for bit,
with every step once in metrics.jsonl and once in TensorBoard."""

import os
import re
import signal
import threading
import time

import jax
import numpy as np
import pytest

from jaxpar import checkpoint, configfile, events, run_setup
from tests.util import TINY, flags, records, start_cli, wait_for_step

EVERY, STEPS = 3, 18  # a checkpoint every 3 steps; the stop (SIGTERM) lands early, far from 18
SETTINGS = {
    **TINY,
    "model.name": "lenet",
    "model.width": 0.25,
    "data.image_shape": (28, 28, 1),
    "mesh_shape": (1, 1, 1),
    "num_train_steps": STEPS,
    "checkpoint_every_steps": EVERY,
}
ARGS = ["--config", "configs/base.py", *flags(SETTINGS)]
LAUNCH_S = 120  # the most one launch may take before it is killed


def one_device_env(**extra) -> dict:
    """The CLI on one simulated device, with this process's other XLA flags."""
    return {"XLA_FLAGS": configfile.with_host_devices(1), **extra}


class Launch:
    """`python -m jaxpar.train ARGS --workdir RUN` in the background, killed by its pid if it
    is still running LAUNCH_S seconds after it started, or when the test ends (`launched`)."""

    def __init__(self, launched: list, run, **env):
        self.proc = start_cli(*ARGS, "--workdir", str(run), env=one_device_env(**env))
        launched.append(self)
        self._timer = threading.Timer(LAUNCH_S, self.kill)
        self._timer.daemon = True
        self._timer.start()
        self.out = ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._timer.cancel()

    def until_step(self, step: int) -> None:
        """Read its output up to the progress line of `step` (or later)."""
        self.out += wait_for_step(self.proc, step)

    def end(self, sig=None) -> int:
        """Send `sig` (if any), read the rest of its output, and return its exit status."""
        if sig is not None:
            os.kill(self.proc.pid, sig)
        self.out += self.proc.stdout.read()
        status = self.proc.wait(timeout=LAUNCH_S)
        self._timer.cancel()
        return status

    def resumed_from(self) -> int:
        return int(re.search(r"resumed from the checkpoint of step (\d+)", self.out).group(1))


@pytest.fixture
def launched():
    """The launches of a test; any still running when it ends is killed."""
    launches: list[Launch] = []
    yield launches
    for launch in launches:
        launch.kill()


def wait_for_checkpoint(run, step: int, launch: Launch) -> None:
    """Until checkpoint `step` is complete on disk (Orbax renames its folder into place)."""
    deadline = time.monotonic() + LAUNCH_S
    while not os.path.isdir(os.path.join(run, "checkpoints", str(step))):
        assert launch.proc.poll() is None and time.monotonic() < deadline, launch.out[-2000:]
        time.sleep(0.05)


def corrupt(run, step: int) -> None:
    """Overwrite every file of checkpoint `step` (which must be complete) with garbage."""
    folder = os.path.join(run, "checkpoints", str(step))
    paths = [os.path.join(root, name) for root, _, files in os.walk(folder) for name in files]
    assert len(paths) > 5, f"checkpoint {step} is missing or incomplete: {paths}"
    for path in paths:
        with open(path, "wb") as f:
            f.write(b"garbage")


def last_logged(run) -> int:
    return max((r["step"] for r in records(run, "train")), default=0)


def test_killed_stopped_and_corrupted_over_and_over_it_is_the_uninterrupted_run(tmp_path, launched):
    run, ref = str(tmp_path / "run"), str(tmp_path / "ref")
    redone = []  # per continuation: logged steps it had to train again

    # The uninterrupted run, alongside: the same command in the same environment (one
    # device), since a process with other devices may round a reduction differently.
    uninterrupted = Launch(launched, ref)

    # 1. SIGKILL: the run hangs inside step 5 (JAXPAR_TEST_HANG), steps 1-4 logged; killed
    # once the checkpoint of step 3 is on disk.
    first = Launch(launched, run, JAXPAR_TEST_HANG="0:5")
    first.until_step(4)
    wait_for_checkpoint(run, 3, first)
    assert first.end(signal.SIGKILL) == -signal.SIGKILL

    # 2. SIGTERM at the first step it trains: it saves the step it stopped at and says which.
    logged = last_logged(run)
    second = Launch(launched, run)
    second.until_step(4)
    assert second.end(signal.SIGTERM) == 0, second.out[-2000:]
    redone.append(logged - second.resumed_from())
    stopped = int(re.search(r"SIGTERM: saved the checkpoint of step (\d+); stopped", second.out)[1])
    assert stopped == last_logged(run) < STEPS - EVERY, second.out[-2000:]

    # 3. The checkpoint it saved is corrupted: the next run says so in one line, moves it aside,
    # resumes from the one before, and is killed once it has saved the next checkpoint.
    corrupt(run, stopped)
    logged = last_logged(run)
    before = max(setup for setup in range(EVERY, stopped, EVERY))  # the newest checkpoint before it
    after = before + EVERY  # the next one it saves
    third = Launch(launched, run, JAXPAR_TEST_HANG=f"0:{after + 1}")
    third.until_step(after)
    wait_for_checkpoint(run, after, third)
    assert third.end(signal.SIGKILL) == -signal.SIGKILL
    assert third.resumed_from() == before
    redone.append(logged - before)
    fallback = [line for line in third.out.splitlines() if "read back" in line]
    assert len(fallback) == 1 and fallback[0].startswith(f"checkpoint {stopped} does not read ")
    assert fallback[0].endswith(f"trying the checkpoint of step {before}")
    assert os.path.isdir(os.path.join(run, "checkpoints", f"unreadable-{stopped}"))

    # 4. Its newest checkpoint corrupted too; the last run falls back again and finishes.
    corrupt(run, after)
    logged = last_logged(run)
    last = Launch(launched, run)
    assert last.end() == 0, last.out[-2000:]
    assert last.resumed_from() == before
    redone.append(logged - before)
    assert sum("does not read back" in line for line in last.out.splitlines()) == 1
    assert "Traceback" not in first.out + second.out + third.out + last.out

    # No continuation trained again more than the steps between two checkpoints.
    assert max(redone) <= EVERY, redone
    assert uninterrupted.end() == 0, uninterrupted.out[-2000:]
    # Every step once, in metrics.jsonl and in TensorBoard; the losses and the final
    # parameters are the uninterrupted run's, bit for bit.
    expected = [r["loss"] for r in records(ref, "train")]
    assert [r["step"] for r in records(run, "train")] == list(range(1, STEPS + 1))
    assert [r["loss"] for r in records(run, "train")] == expected
    shown = events.read_scalars(os.path.join(run, "tensorboard"))
    assert [step for step, _ in shown["train/loss"]] == list(range(1, STEPS + 1))
    np.testing.assert_array_equal([v for _, v in shown["train/loss"]], np.float32(expected))
    assert [step for step, _ in shown["eval/loss"]] == [STEPS]
    kept = os.listdir(os.path.join(run, "checkpoints"))  # both corrupted ones, kept aside
    assert sum(name.startswith("unreadable-") for name in kept) == 2 and str(STEPS) in kept
    overrides, rest = configfile.split_overrides(ARGS)
    config = configfile.override(configfile.load(rest[rest.index("--config") + 1]), overrides)
    setup = run_setup.setup(config, jax.devices()[:1])
    finals = []
    for workdir in (run, ref):
        with checkpoint.Checkpointer(workdir, config, setup.model, EVERY, 3) as ckpt:
            state, step = ckpt.restore(setup.strategy.host_target())
        assert step == STEPS
        finals.append(state)
    jax.tree.map(np.testing.assert_array_equal, *finals)
