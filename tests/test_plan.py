"""python -m jaxpar.plan: the enumeration and the trainer's refusals (pure, no compile), the
ranking and the report (a stand-in predictor), and one real prediction of three candidates."""

from __future__ import annotations

import dataclasses
import math
import shlex

import pytest

from jaxpar import configfile, parallel
from jaxpar.errors import ConfigError
from jaxpar.plan import (
    APPROX_SYNC,
    EXACT_SYNC,
    Candidate,
    PlanRow,
    command,
    commonest,
    enumerate_candidates,
    factorisations,
    microbatch_counts,
    plan,
    rank,
)
from jaxpar.plan import __main__ as cli
from jaxpar.plan.report import report
from jaxpar.predict import PredictedRow
from jaxpar.predict.profiles import fitting
from tests.util import tiny_config

GIB = 2**30
# The tests of the search itself plan over the original three axes (their counts are exact);
# tests/test_axes.py checks that fsdp and node meshes are enumerated too.
THREE = ("data", "stage", "tensor")


def _profile(n: int = 8, memory: float = 1e9):
    return fitting.from_config(
        {
            "name": "tiny",
            "num_devices": n,
            "devices_per_node": n,
            "peak_flops": {"float32": 1e12},
            "memory_bytes": memory,
            "intra": {"bandwidth": 10e9, "latency": 1e-5},
            "compute_efficiency": 0.5,
        }
    )


def _config(**kw):
    return tiny_config(**{"model.batch_norm": True, **kw})  # batch 16, vgg11 at 1/16 width


def test_factorisations_of_8_are_the_ten_meshes():
    meshes = factorisations(8)
    assert len(meshes) == 10 == len(set(meshes))
    assert all(math.prod(m) == 8 for m in meshes)
    assert meshes[0] == (8, 1, 1) and (2, 2, 2) in meshes and (1, 1, 8) in meshes
    assert len(factorisations(12)) == 18 and factorisations(1) == [(1, 1, 1)]


def test_microbatch_counts_divide_the_replica_batch_up_to_4k():
    assert microbatch_counts(16, 2) == [1, 2, 4, 8]  # 4K = 8
    assert microbatch_counts(16, 4) == [1, 2, 4, 8, 16]
    assert microbatch_counts(4, 8) == [1, 2, 4]  # the batch limits it
    assert microbatch_counts(24, 3) == [1, 2, 3, 4, 6, 8, 12]  # multiples of K=3 too


def test_enumerator_keeps_what_the_trainer_runs_and_refuses_the_rest():
    config = _config()
    valid, refused = enumerate_candidates(config, 8, axes=THREE)
    # tensor 8 splits 4 channels nowhere at this width: refused before anything is built
    assert {c.mesh for c in valid} == set(factorisations(8)) - {(1, 1, 8)} | {(1, 1, 1)}
    assert (len(valid), len(refused)) == (386, 29)
    for c in valid[::25]:  # the kept ones validate (as the trainer checks them)
        shape = parallel.validate(c.apply(config), 8 if c.mesh != (1, 1, 1) else 1)
        assert tuple(shape.values()) == c.mesh
    # what the trainer always refuses is not offered: naive beyond one micro-batch, the
    # zero-bubble schedules with recomputation, interleaved and ZB-V off multiples of K
    offered = valid + [c for c, _ in refused]
    assert {c.microbatches for c in offered if c.schedule == "naive"} == {1}
    assert not any(c.remat for c in offered if c.schedule in ("zb-h1", "zb-v"))
    grouped = [c for c in offered if c.schedule in ("interleaved", "zb-v")]
    assert grouped and all(c.microbatches % c.stages == 0 for c in grouped)
    for rule in (
        {"pipeline.schedule": "naive", "pipeline.num_microbatches": 4},
        {"pipeline.schedule": "zb-h1", "pipeline.remat": True},
        {
            "pipeline.schedule": "interleaved",
            "pipeline.virtual_stages": 2,
            "pipeline.num_microbatches": 2,
        },
    ):
        with pytest.raises(ConfigError):  # as the trainer refuses them
            parallel.validate(_config(mesh_shape=(1, 4, 2), **rule), 8)
    zb = Candidate((1, 8, 1), "zb-h1", 8, False, 1, "flops", "allreduce")
    assert zb in valid
    # refusals only the model tells, counted before trying (they used to come while building)
    why = {c: reason for c, reason in refused}
    assert why[Candidate((1, 1, 8))].startswith("conv1/BatchNorm_0/bias has 4 along")
    deep = Candidate((1, 8, 1), "interleaved", 8, True, 4, "flops", "allreduce")
    assert why[deep] == "32 stages but vgg11 has 9 layers; use 1 to 9 stages"
    assert Candidate((1, 4, 2), "interleaved", 4, True, 2, "flops", "allreduce") in valid
    # data 2 of batch 16: 8 images per replica, so M=16 is never offered on (2,4,1)
    assert max(c.microbatches for c in valid if c.mesh == (2, 4, 1)) == 8
    # reasons that differ only in their numbers count as one: 16 or 32 chunks of 9 layers
    (reason, count), (_, count2) = commonest(refused, 2)
    assert (count, count2) == (28, 1) and reason.endswith("use 1 to 9 stages")


def test_data_meshes_list_only_exact_sync_unless_all_sync():
    config = _config()
    valid, _ = enumerate_candidates(config, 8, axes=THREE)
    assert {c.sync for c in valid if c.mesh == (8, 1, 1)} == set(EXACT_SYNC)
    assert {c.sync for c in valid if c.mesh[0] == 1} == {"allreduce"}
    assert all(c.exact for c in valid)
    more, refused = enumerate_candidates(config, 8, all_sync=True, axes=THREE)
    assert {c.sync for c in more if c.mesh == (8, 1, 1)} == set(EXACT_SYNC + APPROX_SYNC)
    assert not any(c.exact for c in more if c.sync in APPROX_SYNC)
    assert len(more) - len(valid) == 193
    # independent replicas: allowed on data meshes with local BatchNorm, refused on stages
    for mode in ("local_sgd", "independent"):  # replicas trained apart: their own statistics
        assert Candidate((8, 1, 1), sync=mode).overrides(config)["sync.batch_norm"] == "local"
    assert any(c.sync == "independent" and "pipeline stages" in r for c, r in refused)


def _fake_predict(config, profile):
    """Step time and memory made up from the mesh: data is fast, stages save memory."""
    d, s, t = config.mesh_shape
    n = d * s * t
    step = 1e-3 * (8 / n + 0.3 * math.log2(n) + (0.5 if s > 1 else 0) + 0.1 * t)
    if s > 1:
        step += 1e-3 / config.pipeline.num_microbatches
    if config.sync.mode == "sharded":
        step += 0.2e-3
    memory = 4 * GIB / (s * t) + 0.1 * GIB * d
    return PredictedRow(
        status="ok",
        step_time_s=step,
        images_per_sec=16 / step,
        compute_s=step / 2,
        comm_s=step / 4,
        bubble_s=step / 8,
        overhead_s=step / 8,
        memory_bytes_per_device=memory,
        num_devices=n,
        mesh_shape=(d, s, t),
    )


def _row(candidate=None, calls=None, **predicted) -> PlanRow:
    """A plan row of `candidate` (default (8,1,1)) with the predicted figures given."""
    return PlanRow(PredictedRow(status="ok", **predicted), candidate or Candidate((8, 1, 1)), calls)


def test_rounds_rank_by_step_time_within_the_memory_limit():
    config = _config()
    lines = []
    result = plan(
        config,
        _profile(),
        max_candidates=30,
        expand=2,
        predict=_fake_predict,
        log=lines.append,
        axes=THREE,
    )
    assert len(result.rows) == len(lines) == 30  # the bound, with progress and ETA per row
    assert "ETA" in lines[-1] and "round 2" in lines[-1]
    assert result.baseline.candidate.mesh == (1, 1, 1)
    assert result.considered == 386 and result.skipped == 386 - 30
    # round 1: one setting per mesh (10 with the baseline; (1,1,8) is refused at this width),
    # 1F1B at M = min(4K, batch limit)
    first = [r.candidate for r in result.rows[:10]]
    assert len({c.mesh for c in first}) == 10
    assert all(c.schedule in (None, "1f1b") for c in first)
    assert {c.mesh: c.microbatches for c in first}[(2, 4, 1)] == 8
    fitting, too_big = rank(result.rows, 2.5 * GIB)
    steps = [r.predicted.step_time_s for r in fitting]
    assert steps == sorted(steps) and len(fitting) + len(too_big) == 30
    assert all(r.predicted.memory_bytes_per_device <= 2.5 * GIB for r in fitting)
    assert all(r.predicted.memory_bytes_per_device > 2.5 * GIB for r in too_big)
    assert fitting[0].candidate.mesh == (4, 1, 2)  # (8,1,1) is faster but needs 4.8 GiB
    assert too_big[0].candidate.mesh == (8, 1, 1)
    best = fitting[0]
    # _fake_predict by hand: (1,1,1) takes 1e-3 (8 + 0.1) s, (4,1,2) 1e-3 (1 + 0.3 x 3 + 0.2)
    assert result.baseline.predicted.step_time_s == pytest.approx(8.1e-3)
    assert best.predicted.step_time_s == pytest.approx(2.1e-3)
    assert best.speedup == pytest.approx(8.1 / 2.1)
    text, rec, cmd = report(result, _profile(), 2.5 * GIB, 5, "configs/vgg19_data.py", config, {})
    assert text.count("\n| ") == 6  # header and 5 rows
    assert "Faster, but do not fit:\n  (8,1,1) allreduce" in text and "needs 4.80 GiB" in text
    assert rec.startswith("(4,1,2) allreduce:") and "--config.mesh_shape=(4,1,2)" in cmd
    # a limit below every candidate: none fits, and the report says so
    assert rank(result.rows, 0.1 * GIB)[0] == []
    text, rec, cmd = report(result, _profile(), 0.1 * GIB, 5, "x.py", config, {})
    assert "none of the predicted candidates fits 0.10 GiB per device" in text
    # the least of _fake_predict's 4/(s t) + 0.1 d GiB: d = 1, s t = 8 (round 1 has (1,8,1))
    assert min(r.predicted.memory_bytes_per_device for r in result.rows) == pytest.approx(0.6 * GIB)
    assert "the smallest needs 0.60 GiB" in text
    assert rec is None and cmd is None


def test_a_config_nothing_runs_is_one_line():
    with pytest.raises(ConfigError, match="no partitioning of 8 devices.*must be positive"):
        plan(_config(global_batch_size=0), _profile(), predict=_fake_predict, log=print)


@pytest.mark.parametrize(
    "candidate",
    [
        Candidate((4, 2, 1), "zb-v", 2, False, 1, "flops", "sharded"),
        Candidate((2, 2, 2), "interleaved", 4, True, 2, "params", "parameter_server"),
        Candidate((8, 1, 1), sync="independent"),
        Candidate((1, 1, 1)),
    ],
)
def test_recommended_command_gives_a_config_the_trainer_accepts(candidate):
    config = configfile.load("configs/vgg19_data.py")
    row = PlanRow(PredictedRow(status="ok"), candidate)
    assert Candidate.of_record(candidate.as_dict()) == candidate
    extra = {"model.width": 0.0625, "global_batch_size": 16}
    cmd = command("configs/vgg19_data.py", row, config, extra)
    args = shlex.split(cmd)
    assert args[:5] == ["python", "-m", "jaxpar.train", "--config", "configs/vgg19_data.py"]
    overrides, rest = configfile.split_overrides(args[5:])
    assert rest == [] and overrides["mesh_shape"] == candidate.mesh
    fresh = configfile.override(configfile.load(args[4]), overrides)
    assert tuple(parallel.validate(fresh, math.prod(candidate.mesh)).values()) == candidate.mesh
    if candidate.schedule:
        assert fresh.pipeline.num_microbatches == candidate.microbatches
        assert fresh.pipeline.remat == candidate.remat


def test_cli_errors_are_one_line(capsys):
    assert cli.main(["--config", "nope.py", "--profile", "configs/hardware/cpu_2core.py"]) == 2
    assert capsys.readouterr().err == "error: no such config file 'nope.py'\n"
    tables = "configs/predict/tf_cnn_benchmarks.py"  # Python, but not a config
    assert cli.main(["--config", tables, "--profile", "configs/hardware/cpu_2core.py"]) == 2
    assert capsys.readouterr().err == (
        f"error: {tables} has no get_config(): not a config, suite or profile file\n"
    )
    assert cli.main(["--config", "configs/vgg19_data.py", "--profile", "nope.py"]) == 2
    assert "error: no such profile file 'nope.py'" in capsys.readouterr().err
    argv = ["--config", "configs/vgg19_data.py", "--profile", "configs/hardware/cpu_2core.py"]
    assert cli.main([*argv, "--config.model.nope=1"]) == 2
    assert capsys.readouterr().err == "error: unknown config key 'model.nope'\n"


def test_a_config_file_that_does_not_run_is_one_line(tmp_path, capsys):
    """A config file with a syntax error or a bad import: the file and Python's own line, not
    a traceback (configfile.load, under every entry point that reads config files)."""
    bad = tmp_path / "bad.py"
    bad.write_text("def get_config(:\n")
    assert cli.main(["--config", str(bad), "--profile", "configs/hardware/cpu_2core.py"]) == 2
    assert capsys.readouterr().err == (
        f"error: {bad} does not load: SyntaxError: invalid syntax (bad.py, line 1)\n"
    )
    bad.write_text("import no_such_module_here\n\ndef get_config():\n    return None\n")
    with pytest.raises(ConfigError, match="ModuleNotFoundError: No module named 'no_such_"):
        configfile.load(str(bad))


def test_a_bound_below_the_mesh_count_says_which_meshes_were_not_reached():
    """Round 1 predicts one setting per mesh within --max_candidates: with 5, the baseline and
    4 of the 9 meshes the trainer accepts (of 8's 10 factorisations, (1,1,8) is refused at this
    width), and the report says so and what bound reaches them all (9 meshes + the baseline)."""
    config = _config()
    result = plan(
        config,
        _profile(),
        max_candidates=5,
        expand=2,
        predict=_fake_predict,
        log=lambda s: None,
        axes=THREE,
    )
    assert (result.meshes, result.meshes_unseen, len(result.rows)) == (9, 5, 5)
    text, _, _ = report(result, _profile(), 2.5 * GIB, 5, "x.py", config, {})
    assert "round 1 reached 4 of 9 meshes: --max_candidates 10 or more tries each once" in text
    full = plan(
        config,
        _profile(),
        max_candidates=10,
        expand=2,
        predict=_fake_predict,
        log=lambda s: None,
        axes=THREE,
    )
    assert full.meshes_unseen == 0
    assert "round 1 reached" not in report(full, _profile(), 2.5 * GIB, 5, "x.py", config, {})[0]


def test_real_predictions_of_three_candidates():
    """Compiles three candidates on a 2-device tiny profile."""
    result = plan(tiny_config(), _profile(n=2), max_candidates=3, log=lambda s: None, axes=THREE)
    names = [r.name for r in result.rows]
    assert names == ["(1,1,1)", "(2,1,1) allreduce", "(1,2,1) 1f1b M=8 remat"]
    assert all(r.ok and r.predicted.step_time_s > 0 for r in result.rows)
    base, data, pipe = result.rows
    assert base.speedup == 1.0
    assert data.collective_calls_per_step["all-reduce data"] >= 1
    # a pipeline stage holds about half the parameters; two replicas hold all of them each
    assert pipe.predicted.memory_bytes_per_device < base.predicted.memory_bytes_per_device
    fitting, _ = rank(result.rows, 1e9)
    steps = sorted(r.predicted.step_time_s for r in result.rows)
    assert [r.predicted.step_time_s for r in fitting] == steps


def test_unplaced_collectives_are_flagged_and_not_recommended():
    """A collective the predictor could not place on mesh axes ("?") would be priced at 0 s:
    the planner flags such a row and recommends a fully priced one."""
    from jaxpar.plan import unpriced, why

    ps = PlanRow(
        dataclasses.replace(
            _fake_predict(_config(mesh_shape=(8, 1, 1)), None),
            collective_bytes_per_device={"collective-permute ?": 240e6, "all-reduce data": 1e3},
        ),
        Candidate((8, 1, 1), sync="parameter_server"),
    )
    ar = PlanRow(
        dataclasses.replace(
            _fake_predict(_config(mesh_shape=(4, 1, 2)), None),
            collective_bytes_per_device={"all-reduce data": 40e6, "all-gather ?": 2560},
        ),
        Candidate((4, 1, 2)),
    )
    assert unpriced(ps) == {"collective-permute ?": 240e6} and unpriced(ar) == {}
    assert "NOT priced: collective-permute ? 240.0 MB" in why(ps, _profile())
    assert ps.predicted.step_time_s < ar.predicted.step_time_s
    result = plan_of([ps, ar])
    text, rec, _ = report(result, _profile(), 10 * GIB, 5, "x.py", _config(), {})
    assert rec.startswith("(4,1,2)") and "leaves some of its traffic unpriced" in text


def plan_of(rows):
    from jaxpar.plan import Plan

    return Plan(rows, [], None, 8, len(rows), 0)


def test_why_names_the_links_a_collective_runs_on():
    """On 2 nodes of 8: node x data's all-gather over `data` stays inside a node (NVLink,
    360 GB/s), its all-reduce over `node` crosses (InfiniBand, 45 GB/s), and a flat data 16
    crosses; the line names the collective that costs the most time there, not the most
    bytes (80 MB inside a node take 0.22 ms, 20 MB across 0.44 ms)."""
    from jaxpar.plan import why

    # the links of configs/hardware/h100_sxm_2nodes_ib.py (loading it would fit its compute, which is slow)
    profile = fitting.from_config(
        {
            "name": "2 x 8",
            "num_devices": 16,
            "devices_per_node": 8,
            "peak_flops": {"float32": 1e12},
            "memory_bytes": 1e9,
            "compute_efficiency": 0.5,
            "intra": {"bandwidth": 360e9, "latency": 5e-6},
            "inter": {"bandwidth": 45e9, "latency": 1e-5},
        }
    )
    row = {
        "step_time_s": 10e-3,
        "compute_s": 5e-3,
        "comm_s": 5e-3,
        "num_devices": 16,
        "mesh_axes": ("node", "data"),
        "mesh_shape": (2, 8),
    }
    inside = _row(
        **row, collective_bytes_per_device={"all-gather data": 80e6, "all-reduce node": 20e6}
    )
    assert why(inside, profile).endswith("all-reduce node 20.0 MB/step over 2 nodes (45 GB/s)")
    mostly = _row(
        **row, collective_bytes_per_device={"all-gather data": 800e6, "all-reduce node": 20e6}
    )
    assert why(mostly, profile).endswith(
        "all-gather data 800.0 MB/step over intra-node links (360 GB/s)"
    )
    flat = _row(
        **{**row, "mesh_axes": ("data", "stage", "tensor"), "mesh_shape": (16, 1, 1)},
        collective_bytes_per_device={"all-reduce data": 200e6},
    )
    assert why(flat, profile).endswith("all-reduce data 200.0 MB/step over 2 nodes (45 GB/s)")


def test_why_names_an_unwired_hop_inside_a_node():
    """On a DGX-1's cube mesh (quads wired all to all, GPU i to i + 4), a data 8 ring in rank
    order crosses 3 -> 4 unwired (through the hosts, 8 GB/s here); the tensor 4 of a (2, 1, 4)
    mesh stays inside a quad, on NVLink (18 GB/s)."""
    from jaxpar.plan import why

    cube = [(a, b) for a in range(8) for b in range(a + 1, 8) if a // 4 == b // 4 or b == a + 4]
    profile = fitting.from_config(
        {
            "name": "cube",
            "num_devices": 8,
            "devices_per_node": 8,
            "peak_flops": {"float32": 1e12},
            "memory_bytes": 1e9,
            "compute_efficiency": 0.5,
            "intra": {"bandwidth": 18e9, "latency": 1e-5},
            "peers": cube,
            "unwired": {"bandwidth": 8e9, "latency": 2.5e-5},
        }
    )
    row = {
        "step_time_s": 10e-3,
        "compute_s": 5e-3,
        "comm_s": 5e-3,
        "num_devices": 8,
        "mesh_axes": ("data", "stage", "tensor"),
    }
    data = _row(**row, mesh_shape=(8, 1, 1), collective_bytes_per_device={"all-reduce data": 100e6})
    assert why(data, profile).endswith(
        "all-reduce data 100.0 MB/step over an unwired hop (through the hosts) (8 GB/s)"
    )
    quad = _row(
        **row, mesh_shape=(2, 1, 4), collective_bytes_per_device={"all-reduce tensor": 100e6}
    )
    assert why(quad, profile).endswith(
        "all-reduce tensor 100.0 MB/step over intra-node links (18 GB/s)"
    )


def test_a_latency_bound_row_names_the_fixed_cost_of_its_links():
    """A row whose exposed communication is mostly per-call cost (40 calls of 1 kB: 0.2 ms at
    full bandwidth is less than half its 5 ms) is called latency-bound, at the link's latency
    per ring step, or at its cheapest low-latency protocol's where the profile gives one."""
    from jaxpar.plan import reasons
    from jaxpar.predict.profiles import hardware
    from tests.util import tiny_profile

    row = _row(
        calls={"all-reduce data": 40},
        step_time_s=0.010,
        compute_s=0.005,
        comm_s=0.005,
        num_devices=8,
        collective_bytes_per_device={"all-reduce data": 40e3},
    )
    plain = tiny_profile(intra=hardware.Link(10e9, 5e-6))
    assert reasons.why(row, plain) == (
        "comm 50% of step: latency-bound, 40 collective calls/step "
        "(most: all-reduce data x40) at 5 us per ring step"
    )
    fast = {"LL": (6.6e-6, 0.6e-6, 0.4), "LL128": (14e-6, 1.9e-6, 0.92)}
    nccl = tiny_profile(intra=hardware.Link(10e9, 5e-6, protocols=fast))
    assert reasons.why(row, nccl).endswith(
        "at 6.6 us + 0.6 us per ring step (LL; 5 us per ring step otherwise)"
    )
