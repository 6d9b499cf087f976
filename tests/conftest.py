"""Test set-up: eight simulated CPU devices (whatever XLA_FLAGS said), on the CPU, before JAX
starts anywhere."""

import atexit
import os
import shutil
import tempfile

from jaxpar import configfile, log

configfile.set_host_device_count(8, replace=True)
configfile.cpu_only()
log.setup()  # what the entry points do: jaxpar's INFO lines on stdout, where capsys reads them

# XLA's CPU backend without LLVM's optimisation passes: the same HLO programs (XLA's own passes
# all run), compiled in about half the time, which is most of this suite's time; a test's two
# programs (partitioned and reference) always compile alike. The CLI subprocesses inherit it.
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"
# and with its older fusion emitters, which compile these tests' programs faster (compare
# `python -m pytest --durations=20` with and without the flag; tests that mostly run steps do
# not change). The same function either way: both programs
# of every comparison compile alike. The shipped profiles' fitted figures depend on the
# programs they read, so their test reads them as `python -m jaxpar.predict` does, in a process
# with the default emitters (tests/shipped_profiles.py).
if "--xla_cpu_use_fusion_emitters" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] += " --xla_cpu_use_fusion_emitters=false"
# and in one LLVM module: with these emitters, the module split for parallel compilation
# computes wrong BatchNorm gradients on some CPUs (an AMD EPYC with AVX-512: 3% in
# tests/test_data_parallel.py's sync_bn cases), and one module compiles as fast here.
if "--xla_cpu_parallel_codegen_split_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] += " --xla_cpu_parallel_codegen_split_count=1"

# One XLA compilation cache for the session (and the CLI subprocesses it starts): schedules that
# differ only in event order compile identical stage programs, and runs repeat references.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # ours: removed when the session ends
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="jaxpar-xla-cache-")
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


# Tests of ~10 s or more on 2 cores (pytest --durations), kept out of the fast subset
# `python -m pytest -q -m "not slow"`; the full suite (CI) runs them. Every module keeps fast
# tests. Patterns are node ids (fnmatch); tests/slow_tests.txt lists the 2-10 s ones; the
# multi-process launches are marked in their file.
SLOW = (
    "tests/test_model_zoo.py::test_every_family_partitioned_equals_one_device*",
    "tests/test_model_zoo.py::test_resnet20_learns_digits",
    "tests/test_checkpoint.py::test_kill_and_sigterm_resume_exactly",
    "tests/test_checkpoint.py::test_restore_across_meshes*",
    "tests/test_checkpoint.py::test_continuing_a_finished_run_keeps_its_learning_rate_schedule",
    "tests/test_chaos.py::*",
    "tests/test_bench.py::test_sweep_writes_results_table_and_plots",
    "tests/test_pipeline.py::test_batch_norm_statistics_per_micro_batch*",
    "tests/test_perfmodel.py::test_profiles_load*",  # one process loads them all: ~2 min
    "tests/test_perfmodel.py::test_dgx1_calibration_reproduces_the_one_gpu_figure",
    "tests/test_perfmodel.py::test_h100_fit_predicts_the_row_it_leaves_out",  # the shipped profiles' process
    "tests/test_pipeline_efficiency.py::test_stored_bytes_are_the_residuals_and_one_f_one_b_stays_flat",
    "tests/test_pipeline_efficiency.py::test_batch_norm_micro_batch_policy_with_residuals",
    "tests/test_sync.py::test_cli_sigterm_with_gradients_pending_resumes_exactly",
    "tests/test_sync.py::test_other_modes_on_hybrid_meshes_equal_data_parallel*",
    "tests/test_sync.py::test_local_sgd_averages_every_period",
    "tests/test_tensor.py::test_tensor_split_with_synchronised_batch_norm",
    "tests/test_balance.py::test_layer_times_are_cached_and_measured_again_when_the_shape_changes",
    "tests/test_batch_study.py::test_a_two_row_study_runs_end_to_end",
    "tests/test_spatial.py::test_every_family_split_by_rows_equals_one_device*",
    "tests/test_config.py::test_every_command_a_config_file_offers_validates",
    "tests/test_spatial.py::test_vgg19_data_by_spatial_equals_one_device",
    "tests/test_spatial.py::test_the_predictor_prices_each_halo_as_a_neighbour_message",
)


# The extended tier: a further variant, or a stress run, of a behaviour a test of the default
# suite already holds (named beside each), or a re-measurement of shipped figures that takes
# minutes. `python -m pytest -q` leaves them out (pyproject.toml's addopts: -m "not extended");
# `python -m pytest -q -m extended` runs them, and is run before a change to what they cover
# lands (docs/tests.md). All are slow too.
EXTENDED = (
    # the shipped profiles' fits, in a process of their own: test_calibrate_here.py fits a
    # profile end to end, and test_perfmodel.py's unfitted profiles load
    "tests/test_perfmodel.py::test_fitted_profiles_load*",
    "tests/test_perfmodel.py::test_dgx1_calibration_reproduces_the_one_gpu_figure",
    "tests/test_perfmodel.py::test_h100_fit_predicts_the_row_it_leaves_out",
    # SIGKILL and SIGTERM to the command line, resumed bit for bit: test_chaos.py holds both,
    # and test_sync.py's test_resume_is_bit_exact every sync mode's state (pending gradients)
    "tests/test_checkpoint.py::test_kill_and_sigterm_resume_exactly",
    "tests/test_sync.py::test_cli_sigterm_with_gradients_pending_resumes_exactly",
    # the README's main job in two processes: test_multiprocess.py's sweep evaluates and
    # checkpoints every pipeline schedule across two processes as on one device
    "tests/test_multiprocess.py::test_the_main_job_in_two_processes_evaluates_as_one",
    # a stress run of the pipeline sweep's lone stages ((2,4,1): one device of each stage
    # per process) on 2 devices, 2 pool threads, per process
    "tests/test_multiprocess.py::test_one_device_of_each_stage_per_process_trains_as_one_process",
    # the coordinator killed (JAX's runtime ends the survivor); jaxpar's watchdog on a lost
    # worker is test_a_killed_process_stops_the_other_within_a_minute[1]
    "tests/test_multiprocess.py::test_a_killed_process_stops_the_other_within_a_minute[[]0]",
    # a process hung in two: test_hardening.py's hung run in one process (stacks, one line),
    # and test_a_killed_process_stops_the_other_within_a_minute[1] on a lost one of two
    "tests/test_multiprocess.py::test_a_hung_process_ends_every_process_with_one_line",
    # a SLURM job stopped and requeued twice: test_slurm.py's scancel test runs a job's tasks
    # as one JAX system, test_chaos.py stops and resumes a run over and over
    "tests/test_slurm.py::test_a_job_stopped_twice_resumes_each_time_and_trains_as_one_process",
    # ResNet-20 by rows on 2 and 4 bands: ResNet-50's stride-2 stem and blocks on 4 bands
    "tests/test_spatial.py::test_every_family_split_by_rows_equals_one_device[[]resnet20[]]",
)


def pytest_collection_modifyitems(config, items):
    import fnmatch

    import pytest

    listed = os.path.join(os.path.dirname(__file__), "slow_tests.txt")
    with open(listed, encoding="utf-8") as f:
        ids = {line.strip() for line in f if line.strip() and not line.startswith("#")}
    for item in items:
        if any(fnmatch.fnmatchcase(item.nodeid, p) for p in EXTENDED):
            item.add_marker(pytest.mark.extended)
            item.add_marker(pytest.mark.slow)
        elif item.nodeid in ids or any(fnmatch.fnmatchcase(item.nodeid, p) for p in SLOW):
            item.add_marker(pytest.mark.slow)
