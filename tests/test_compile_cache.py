"""XLA's persistent compilation cache (jaxpar/compile_cache.py): a second identical run loads
its programs instead of compiling them, and the off key writes nothing."""

import json
import os
import resource
import signal

import jax
import pytest

from jaxpar import compile_cache, jax_internals
from tests.util import ROOT, TINY, flags, run_cli

# Two steps of the tiny model on one device: a few programs, compiled in seconds.
CONFIG = ["--config", os.path.join(ROOT, "configs/vgg19_data.py")]
RUN = CONFIG + flags({**TINY, "num_train_steps": 2, "num_devices": 1, "checkpoint_every_steps": 0})


def _summary(workdir) -> dict:
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    (summary,) = [r for r in map(json.loads, lines) if r["split"] == "summary"]
    return summary


def _home(tmp_path) -> dict:
    """An environment whose user cache directory is under tmp_path, so that nothing a test
    does reaches the user's own (~/.cache/jaxpar/xla)."""
    home = tmp_path / "home"
    return {"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache")}


def test_a_second_run_loads_every_train_step_program_and_matches(tmp_path):
    cache = tmp_path / "xla"
    env = _home(tmp_path)
    runs = []
    for name in ("first", "second"):  # each in a fresh process
        workdir = ["--workdir", str(tmp_path / name)]
        proc = run_cli(*RUN, f"--config.compile_cache={cache}", *workdir, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append((_summary(tmp_path / name), proc.stdout))
    (first, first_out), (second, second_out) = runs
    entries = [p for p in os.listdir(cache) if p.endswith("-cache")]
    assert entries
    assert first["compile_cache_dir"] == second["compile_cache_dir"] == str(cache)
    assert first["compile_cache_hits"] == 0 and first["compile_cache_misses"] > 0
    step_programs = first["compile_cache_misses"]
    assert (second["compile_cache_hits"], second["compile_cache_misses"]) == (step_programs, 0)
    assert second["xla_programs_cached"] == second["xla_programs"] > 0
    assert second["final_loss"] == first["final_loss"]  # the same executables, bit for bit
    assert second["eval_loss"] == first["eval_loss"]
    said = f"{step_programs} of {step_programs} programs from the compile cache"
    assert said in second_out and f"0 of {step_programs} programs" in first_out
    assert f"{step_programs} of {step_programs}  ({cache})" in second_out  # the summary table
    assert not os.path.exists(tmp_path / "home")


def test_the_off_key_writes_nothing(tmp_path):
    """compile_cache="off" wins over JAX_COMPILATION_CACHE_DIR, and "auto" with JAX's own
    switch off (JAX_ENABLE_COMPILATION_CACHE=false, what `bench --no_xla_cache` sets) is off
    too; neither touches the user cache directory."""
    where = tmp_path / "env-cache"
    env = {**_home(tmp_path), "JAX_COMPILATION_CACHE_DIR": str(where)}
    off = run_cli(*RUN, "--config.compile_cache=off", "--workdir", str(tmp_path / "off"), env=env)
    assert off.returncode == 0, off.stderr[-3000:]
    env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    auto = run_cli(*RUN, "--workdir", str(tmp_path / "auto"), env=env)
    assert auto.returncode == 0, auto.stderr[-3000:]
    for name in ("off", "auto"):
        summary = _summary(tmp_path / name)
        assert summary["compile_cache_dir"] is None
        assert summary["compile_cache_hits"] == summary["compile_cache_misses"] == 0
        assert summary["xla_programs"] > 0 and summary["xla_programs_cached"] == 0
    assert "none: compile_cache off" in off.stdout
    assert not os.path.exists(where) and not os.path.exists(tmp_path / "home")


def test_an_entry_cut_off_while_written_is_never_found_under_its_name(tmp_path):
    """A reader (another process sharing the directory) sees a whole entry or none: a write cut
    off half-way (the process's file size limit, as a full disk cuts it) leaves nothing under
    the entry's name and no temporary file, and the next write of the entry succeeds. JAX
    0.10.2's own cache, writing in place, leaves the half under the name and fails this."""
    where = tmp_path / "xla"
    value = bytes(range(256)) * 256
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    on_too_big = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG, not a killed worker
    try:
        assert compile_cache.enable(str(where)) == str(where)
        jax_cache = jax_internals.resolve("jax._src.compilation_cache")
        cache, _ = jax_cache.get_file_cache(str(where))
        resource.setrlimit(resource.RLIMIT_FSIZE, (len(value) // 2, limits[1]))
        try:
            with pytest.raises(OSError):
                cache.put("entry", value)
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        assert os.listdir(where) == [] and cache.get("entry") is None
        cache.put("entry", value)
        assert cache.get("entry") == value and len(os.listdir(where)) == 1
    finally:
        signal.signal(signal.SIGXFSZ, on_too_big)
        compile_cache.enable()  # back to the suite's own cache directory


def test_the_cache_is_off_inside_the_block_and_as_it_was_after():
    """compile_cache.off (predict's compile-only GPU programs): off inside, restored after,
    whichever way it was."""
    was = jax.config.jax_enable_compilation_cache
    try:
        for setting in (True, False):
            jax.config.update("jax_enable_compilation_cache", setting)
            with compile_cache.off():
                assert jax.config.jax_enable_compilation_cache is False
            assert jax.config.jax_enable_compilation_cache is setting
    finally:
        jax.config.update("jax_enable_compilation_cache", was)
