"""python -m jaxpar.bench: a tiny suite end to end (rows in their own processes, a failing row
recorded, resume without measuring again), the scaling arithmetic and the plots."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import textwrap

import jax
import numpy as np
import pytest
from matplotlib.collections import PathCollection

from jaxpar import config as config_lib
from jaxpar import run_setup, stats, trainer
from jaxpar.bench import outdir, plots, predicted, results, table
from jaxpar.bench.__main__ import main as bench_main
from jaxpar.bench.outdir import Refused
from jaxpar.bench.records import Repeat
from jaxpar.bench.row import write_json
from jaxpar.bench.runner import Sweep
from tests.util import bench_row, tiny_config

SUITE = textwrap.dedent(
    """
    import ml_collections
    from configs.bench import row

    def get_config():
        suite = ml_collections.ConfigDict()
        suite.base = "configs/base.py"
        suite.overrides = ml_collections.ConfigDict({
            "model.name": "vgg11", "model.width": 1 / 16, "model.batch_norm": False,
            "global_batch_size": 16, "num_train_steps": 3, "log_every_steps": 1,
            "eval_every_steps": 0, "checkpoint_every_steps": 0, "lr_schedule": "constant",
            "warmup_steps": 0, "data.name": "synthetic", "data.num_train": 64,
            "data.num_eval": 16,
        }, allow_dotted_keys=True)
        suite.rows = (
            row("1 device", {"mesh_shape": (1, 1, 1)}, group="baseline"),
            row("data 2", {"mesh_shape": (2, 1, 1)}, group="data"),
            row("data 3", {"mesh_shape": (3, 1, 1)}, group="data"),  # 16 % 3: refused
            row("tensor 2", {"mesh_shape": (1, 1, 2)}, group="tensor"),
        )
        return suite
    """
)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    suite = root / "tiny.py"
    suite.write_text(SUITE)
    out = root / "out"
    rows = Sweep(suite=str(suite), out=str(out)).run()
    return suite, out, {r.name: r for r in rows}


def test_sweep_writes_results_table_and_plots(sweep):
    _, out, rows = sweep
    with open(out / "results.json") as f:
        stored = json.load(f)
    assert [r["name"] for r in stored["rows"]] == ["1 device", "data 2", "data 3", "tensor 2"]
    for key in (
        "name",
        "mesh_shape",
        "num_devices",
        "status",
        "error",
        "images_per_sec",
        "speedup",
        "efficiency",
        "param_bytes",
        "memory_bytes_per_device",
        "collective_bytes_per_device",
        "collective_bytes_by_kind",
        "collective_bytes_by_axis",
        "bytes_between_stages",
        "analytic_bubble",
        "measured_bubble",
        "eval_accuracy",
    ):
        assert all(key in r for r in stored["rows"]), key
    one = rows["1 device"]
    assert one.status == "ok" and one.num_devices == 1 and one.speedup == 1.0
    assert one.images_per_sec > 0 and 0 <= one.eval_accuracy <= 1
    assert one.collective_bytes_per_device == 0 and one.analytic_bubble is None
    assert rows["data 2"].mesh_shape == [2, 1, 1] and rows["data 2"].num_devices == 2
    csv_lines = (out / "results.csv").read_text().splitlines()
    assert len(csv_lines) == 5 and csv_lines[0].startswith("name,")
    md = (out / "results.md").read_text()
    assert "| data 2 | (2,1,1) | 2 |" in md and "bounded by the core count" in md
    for png in ("scaling_strong.png", "memory_vs_bytes.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def test_data_parallel_all_reduce_is_the_parameter_bytes(sweep):
    """The gradient all-reduce moves every parameter once (plus loss and accuracy scalars)."""
    r = sweep[2]["data 2"]
    assert r.param_bytes == 4 * r.num_params > 0  # float32 parameters
    assert 0 <= r.data_allreduce_bytes - r.param_bytes <= 16
    assert f"{r.data_allreduce_over_params:.3f}" == "1.000"
    assert r.collective_bytes_by_axis == {"data": r.data_allreduce_bytes}
    assert r.ring_allreduce_wire_bytes == pytest.approx(2 * (2 - 1) / 2 * r.data_allreduce_bytes)


def test_tensor_rows_hold_a_share_of_the_parameters(sweep):
    r = sweep[2]["tensor 2"]
    assert r.status == "ok"
    assert r.param_bytes_per_device * 2 / r.param_bytes == pytest.approx(1.0, abs=0.05)
    assert set(r.collective_bytes_by_axis) == {"tensor"}


def test_a_failing_row_is_recorded_and_the_sweep_goes_on(sweep):
    rows = sweep[2]
    assert rows["data 3"].status == "failed"
    assert "not divisible" in rows["data 3"].error and "\n" not in rows["data 3"].error
    assert rows["data 3"].images_per_sec is None and rows["data 3"].speedup is None
    assert rows["tensor 2"].status == "ok"  # measured after the failure


def test_rerun_resumes_without_measuring(sweep, monkeypatch):
    suite, out, rows = sweep

    def refuse(*args, **kwargs):
        raise AssertionError("a measured row was run again")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    again = Sweep(suite=str(suite), out=str(out)).run()
    assert {r.name: r.images_per_sec for r in again} == {
        name: r.images_per_sec for name, r in rows.items()
    }


def _row(name, devices, rate, scaling="strong", status="ok", **extra):
    return bench_row(
        name=name,
        num_devices=devices,
        images_per_sec=rate,
        scaling=scaling,
        status=status,
        group=extra.pop("group", "data"),
        **extra,
    )


def test_speedup_and_efficiency_from_known_inputs():
    rows = results.add_scaling(
        [
            _row("one", 1, 100.0),
            _row("two", 2, 150.0),
            _row("eight", 8, 400.0),
            _row("weak one", 1, 50.0, scaling="weak"),
            _row("weak four", 4, 160.0, scaling="weak"),
            _row("broken", 4, None, status="failed"),
            _row("against two", 8, 300.0, baseline="two"),
        ]
    )
    got = {r.name: (r.speedup, r.efficiency) for r in rows}
    assert got["one"] == (1.0, 1.0)
    assert got["two"] == (1.5, 0.75)
    assert got["eight"] == (4.0, 0.5)
    assert got["weak four"] == (3.2, 0.8)  # per-device throughput 40 vs 50
    assert got["broken"] == (None, None)
    assert got["against two"] == (2.0, 0.5)  # 300/150 on 8 devices vs 2
    assert results.mean_stderr([1.0, 3.0]) == (2.0, 1.0)
    assert results.mean_stderr([5.0]) == (5.0, None)


def _drawn(monkeypatch) -> dict:
    """Every figure jaxpar.bench.plots saves from now on, by file name, kept to read back what it
    drew (matplotlib's Figure.savefig, wrapped; the files are still written)."""
    from matplotlib.figure import Figure

    figures = {}
    save = Figure.savefig

    def keep(fig, path, *args, **kwargs):
        figures[os.path.basename(str(path))] = fig
        return save(fig, path, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return figures


def _series(ax) -> dict[str, list[list[float]]]:
    """What one Axes shows, by legend label: the points of each line, error-bar line and
    scatter (matplotlib's public artists; unlabelled ones, such as reference lines, left out)."""
    out = {c.get_label(): c.lines[0].get_xydata().tolist() for c in ax.containers}
    for line in ax.get_lines():
        if not line.get_label().startswith("_"):
            out[line.get_label()] = line.get_xydata().tolist()
    for points in ax.collections:
        if isinstance(points, PathCollection) and not points.get_label().startswith("_"):
            out[points.get_label()] = points.get_offsets().tolist()  # a scatter's points
    return out


def _assert_series(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for label, points in want.items():
        np.testing.assert_allclose(got[label], points, err_msg=label)


def test_every_plot_from_known_rows(tmp_path, monkeypatch, capsys):
    """Each picture, read back from the figure: the series it draws and their points, worked
    out from the rows by hand."""
    sized = {"memory_bytes_per_device": 4 << 20, "collective_bytes_per_device": 1 << 20}
    rows = [
        _row(
            "1 device",
            1,
            100.0,
            group="baseline",
            mesh_shape=(1, 1, 1),
            speedup=1.0,
            efficiency=1.0,
            global_batch_size=64,
            eval_accuracy=0.5,
            **{**sized, "collective_bytes_per_device": 0},
        )
    ]
    for n in (2, 4):  # strong: 90 img/s per device; weak: 95
        rows.append(
            _row(
                f"strong data {n}",
                n,
                90.0 * n,
                "strong",
                mesh_shape=(n, 1, 1),
                efficiency=0.9,
                **sized,
            )
        )
        rows.append(
            _row(
                f"weak data {n}",
                n,
                95.0 * n,
                "weak",
                mesh_shape=(n, 1, 1),
                efficiency=0.95,
                **sized,
            )
        )
    for m in (1, 4):
        rows.append(
            _row(
                f"pipe M={m}",
                2,
                80.0,
                mesh_shape=(1, 2, 1),
                group="",
                num_microbatches=m,
                pipeline_schedule="gpipe",
                analytic_bubble=1 / (m + 1),
                measured_bubble=1.2 / (m + 1),
                memory_bytes_per_device=2 << 20,
                collective_bytes_per_device=0,
                stage_transfer_bytes_per_device=1 << 16,
            )
        )
    for lr, accuracy in (("fixed lr", {32: 0.7, 64: 0.6}), ("linear lr", {32: 0.75, 64: 0.7})):
        for b in (32, 64):
            rows.append(
                _row(
                    f"{lr} {b}",
                    8,
                    10.0,
                    "none",
                    group=lr,
                    global_batch_size=b,
                    eval_accuracy=accuracy[b],
                    mesh_shape=(8, 1, 1),
                )
            )
    figures = _drawn(monkeypatch)
    made = plots.plot_all(rows, str(tmp_path))
    (line,) = capsys.readouterr().out.splitlines()
    assert line == (
        "scaling_strong.png does not place 2 rows: pipe M=1 (no group in the suite); "
        "pipe M=4 (no group in the suite)"
    )
    names = [
        "scaling_strong.png",
        "scaling_weak.png",
        "memory_vs_bytes.png",
        "bubble.png",
        "accuracy_vs_batch.png",
    ]
    assert made == [str(tmp_path / n) for n in names] and sorted(figures) == sorted(names)
    assert all((tmp_path / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in names)
    # strong: the baseline starts the data line; efficiency as recorded
    rate, efficiency = figures["scaling_strong.png"].axes
    _assert_series(_series(rate), {"data": [[1, 100], [2, 180], [4, 360]]})
    _assert_series(_series(efficiency), {"data": [[1, 1.0], [2, 0.9], [4, 0.9]]})
    # weak: its own rows only (the one baseline is a strong-scaling row)
    rate, efficiency = figures["scaling_weak.png"].axes
    _assert_series(_series(rate), {"data": [[2, 190], [4, 380]]})
    _assert_series(_series(efficiency), {"data": [[2, 0.95], [4, 0.95]]})
    # MiB communicated (collectives + stage-to-stage bytes: 2^16 B = 1/16 MiB) against MiB held
    (ax,) = figures["memory_vs_bytes.png"].axes
    _assert_series(
        _series(ax), {"1 device": [[0, 4]], "data": [[1, 4]] * 4, "pipeline": [[1 / 16, 2]] * 2}
    )
    # the analytic curve (K-1)/(M+K-1) at K=2 every quarter micro-batch, the measured points
    (ax,) = figures["bubble.png"].axes
    curve = [[m / 4, 1 / (m / 4 + 1)] for m in range(4, 17)]
    _assert_series(
        _series(ax),
        {"K=2 analytic (K-1)/(M+K-1)": curve, "K=2 gpipe measured": [[1, 0.6], [4, 0.24]]},
    )
    # test error 1 - accuracy against the batch, one line per recipe
    (ax,) = figures["accuracy_vs_batch.png"].axes
    _assert_series(
        _series(ax), {"fixed lr": [[32, 0.3], [64, 0.4]], "linear lr": [[32, 0.25], [64, 0.3]]}
    )


def test_scaling_plot_names_the_rows_it_cannot_place(tmp_path, capsys):
    """Failed rows, rows without a group, a second baseline and rows without an efficiency
    are named (printed, and noted on the figure), never dropped silently."""
    rows = [
        _row("1 device", 1, 100.0, group="baseline", efficiency=1.0),
        _row("1 device again", 1, 99.0, group="baseline", efficiency=1.0),
        _row("data 2", 2, 180.0, efficiency=0.9),
        _row("data 4", 4, None, status="failed"),
        _row("pipe M=4", 2, 80.0, group="", efficiency=0.4),
        _row("data 8", 8, 500.0, efficiency=None),
    ]
    made = plots.plot_all(rows, str(tmp_path))
    assert [os.path.basename(p) for p in made] == ["scaling_strong.png"]
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("scaling_strong.png does not place 4 rows: ")
    for name, why in (
        ("1 device again", "a second baseline"),
        ("data 4", "failed"),
        ("pipe M=4", "no group"),
        ("data 8", "no baseline"),
    ):
        assert f"{name} ({why}" in line
    assert plots.unplaced(rows, "weak") == {}
    # memory against communication: a pipeline row recorded without its per-device stage
    # transfers is named, not drawn at its collectives alone
    sized = {"memory_bytes_per_device": 1 << 20, "collective_bytes_per_device": 1 << 20}
    rows = [
        _row("data 2", 2, 1.0, mesh_shape=(2, 1, 1), **sized),
        _row("tensor 2", 2, 1.0, mesh_shape=(1, 1, 2), **sized),
        _row("old pipe", 2, 1.0, mesh_shape=(1, 2, 1), **sized),
    ]
    left = {}
    assert plots.memory_vs_bytes(rows, str(tmp_path / "m.png"), left)
    assert list(left) == ["old pipe"]


def test_num_devices_uses_the_first_n(capsys):
    setup = run_setup.setup(tiny_config(num_devices=2, mesh_shape=(-1, 1, 1)))
    assert setup.mesh.devices.size == 2 and list(setup.mesh.devices.flat) == jax.devices()[:2]
    assert "using the first 2 of 8 devices" in capsys.readouterr().out
    with pytest.raises(config_lib.ConfigError, match="between 0 .all. and the 8 devices"):
        run_setup.setup(tiny_config(num_devices=9))


def test_profile_writes_a_trace(tmp_path):
    config = tiny_config(num_train_steps=5, mesh_shape=(1, 1, 1), checkpoint_every_steps=0)
    result = trainer.train_and_evaluate(config, str(tmp_path), jax.devices()[:1], profile=True)
    traces = list((tmp_path / "profile").rglob("*.trace.json.gz"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0
    report = result.summary.report
    assert report.analytic_bubble is None and report.collective_bytes_per_device == 0


# --- the results folder: never loses or silently mixes results (no training: a fake row) ---


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A suite file, an OUT folder and a fake `Sweep.run_row` that records the rows it runs."""
    suite = tmp_path / "tiny.py"
    suite.write_text(SUITE)
    ran = []

    def run_one(self, r, rep, print_):
        ran.append(r.name)
        record = {
            "status": "ok",
            "images_per_sec": 100.0 + len(ran),
            "step_time_median_s": 0.1,
            "global_batch_size": 16,
            "compile_time_s": 1.0,
            "eval_accuracy": 0.5,
            "num_devices": 1,
            "mesh_shape": [1, 1, 1],
            "fingerprint": print_,
        }
        write_json(outdir.paths(self.out, r.name, rep)[0], record)
        return Repeat.of_record(record)

    monkeypatch.setattr(Sweep, "run_row", run_one)
    return suite, tmp_path / "out", ran


def _sweep(suite, out, **kwargs) -> list[dict]:
    return Sweep(suite=str(suite), out=str(out), plots=False, **kwargs).run()


def _stored_rows(out) -> dict[str, float]:
    with open(out / "results.json") as f:
        return {r["name"]: r["images_per_sec"] for r in json.load(f)["rows"]}


def _snapshot(out) -> dict[str, tuple[int, bytes]]:
    return {str(p): (p.stat().st_mtime_ns, p.read_bytes()) for p in out.rglob("*") if p.is_file()}


def test_only_matching_no_row_is_refused_and_out_untouched(fake, capsys):
    suite, out, ran = fake
    _sweep(suite, out, only="data")
    before = _snapshot(out)
    code = bench_main(["--suite", str(suite), "--out", str(out), "--only", "pipe", "--no_plots"])
    err = capsys.readouterr().err
    assert code == 2 and _snapshot(out) == before and ran == ["data 2", "data 3"]
    assert err == (
        "error: --only 'pipe' matches no row of suite tiny; its rows are: 1 device, data 2, "
        "data 3, tensor 2\n"
    )
    fresh = out.parent / "fresh"
    assert bench_main(["--suite", str(suite), "--out", str(fresh), "--only", "pipe"]) == 2
    assert not fresh.exists()


def test_a_python_file_that_is_not_a_suite_is_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    tables = "configs/predict/tf_cnn_benchmarks.py"  # tables, no get_config
    assert bench_main(["--suite", tables, "--out", str(out), "--no_plots"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.endswith(
        "has no get_config(): not a config, suite or profile file\n"
    )
    assert not out.exists()


def test_a_subset_rerun_keeps_the_other_rows(fake):
    suite, out, ran = fake
    _sweep(suite, out)
    first = _stored_rows(out)
    _sweep(suite, out, only="^data 2$", repeat=2)  # measures data 2's second repeat only
    assert ran == ["1 device", "data 2", "data 3", "tensor 2", "data 2"]
    after = _stored_rows(out)
    assert list(after) == ["1 device", "data 2", "data 3", "tensor 2"]  # suite order
    assert after["data 2"] == (first["data 2"] + 105.0) / 2  # both repeats of data 2
    assert {k: v for k, v in after.items() if k != "data 2"} == {
        k: v for k, v in first.items() if k != "data 2"
    }
    assert len((out / "results.csv").read_text().splitlines()) == 5


def test_other_overrides_or_suite_are_refused_before_running(fake, tmp_path):
    suite, out, ran = fake
    _sweep(suite, out, overrides={"model.width": 0.125})
    before = _snapshot(out)
    with pytest.raises(Refused) as info:
        _sweep(suite, out)
    assert str(info.value) == (
        f"--out {out} was measured with other overrides (model.width=0.125 there, not given "
        "here); pass the same --config overrides, or choose another --out"
    )
    other = tmp_path / "other.py"
    other.write_text(SUITE)
    with pytest.raises(Refused, match="holds suite .*tiny.py, not .*other.py; pass --suite"):
        _sweep(other, out, overrides={"model.width": 0.125})
    assert _snapshot(out) == before and len(ran) == 4
    _sweep(suite, out, overrides={"model.width": 0.125})  # the same overrides: resumes
    assert len(ran) == 4


def test_an_edited_row_is_measured_again_and_its_old_record_kept(fake, capsys):
    suite, out, ran = fake
    _sweep(suite, out)
    old = json.loads((out / "rows" / "data_2.r0.json").read_text())
    (out / "logs" / "data_2.r0.log").write_text("the old run\n")
    suite.write_text(
        SUITE.replace('"mesh_shape": (2, 1, 1)}', '"mesh_shape": (2, 1, 1), "seed": 7}')
    )
    capsys.readouterr()
    _sweep(suite, out)
    assert ran[4:] == ["data 2"]  # only the edited row runs again
    kept = out / "replaced" / f"data_2.r0.{old['fingerprint']}.json"
    assert (
        f"data 2 (repeat 0): its config changed since it was measured; the old record is in {kept}"
        in capsys.readouterr().out
    )
    moved = json.loads(kept.read_text())
    assert moved["images_per_sec"] == old["images_per_sec"]
    assert open(moved["log"]).read() == "the old run\n"
    new = json.loads((out / "rows" / "data_2.r0.json").read_text())
    assert new["fingerprint"] != old["fingerprint"]
    assert _stored_rows(out)["data 2"] == new["images_per_sec"]


# --- predictions beside the measurement (pure functions on known rows; no JAX program) ---


def test_spearman_on_known_inputs():
    assert stats.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert stats.spearman([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    # one swapped pair in five: 1 - 6 * sum(d^2) / (n (n^2 - 1)) = 1 - 6 * 4 / 120
    assert stats.spearman([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) == pytest.approx(0.8)
    # ties share the average rank: x ranks (1, 2.5, 2.5, 4) against (1, 2, 3, 4); Pearson's r
    # of the ranks: deviations (-1.5, 0, 0, 1.5) and (-1.5, -0.5, 0.5, 1.5), 4.5 / sqrt(4.5 * 5)
    assert stats.spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(4.5 / 22.5**0.5)
    # unsorted, with a tie: x ranks (2, 3.5, 3.5, 1), deviations (-0.5, 1, 1, -1.5) against
    # (-1.5, -0.5, 0.5, 1.5): -1.5 / sqrt(4.5 * 5) (ordinal ranks (2, 3, 4, 1) would give -0.2)
    assert stats.spearman([10, 20, 20, 5], [1, 2, 3, 4]) == pytest.approx(-1.5 / 22.5**0.5)
    assert stats.spearman([5, 5, 5], [1, 2, 3]) is None  # no ranking on one side
    assert stats.spearman([1.0], [2.0]) is None
    with pytest.raises(ValueError):
        stats.spearman([1, 2], [1])


def _predicted_row(name, rate, status="ok", **extra):
    """A row of jaxpar.predict's predictions.json (model._row's keys)."""
    if status != "ok":
        return {
            "name": name,
            "profile": "fake",
            "status": status,
            "error": extra["error"],
            "memory_bytes_per_device": 1 << 20,
            "fits": True,
        }
    return {
        "name": name,
        "profile": "fake",
        "status": "ok",
        "images_per_sec": rate,
        "step_time_s": 64 / rate,
        "compute_s": 0.5 * 64 / rate,
        "comm_s": 0.25 * 64 / rate,
        "bubble_s": 0.125 * 64 / rate,
        "overhead_s": 0.125 * 64 / rate,
        "schedule_bubble": extra.get("schedule_bubble"),
        "memory_bytes_per_device": extra.get("memory", 8 << 20),
        "fits": True,
        "speedup": extra.get("speedup"),
        "efficiency": extra.get("efficiency"),
    }


def _measured_rows():
    return [
        _row(
            "one",
            1,
            100.0,
            mesh_shape=[1, 1, 1],
            memory_bytes_per_device=8 << 20,
            collective_bytes_per_device=0,
            step_time_median_s=0.64,
        ),
        _row(
            "two",
            2,
            200.0,
            mesh_shape=[2, 1, 1],
            memory_bytes_per_device=4 << 20,
            collective_bytes_per_device=1 << 20,
            step_time_median_s=0.32,
        ),
        _row(
            "pipe",
            2,
            50.0,
            mesh_shape=[1, 2, 1],
            memory_bytes_per_device=4 << 20,
            collective_bytes_per_device=0,
            measured_bubble=0.4,
            analytic_bubble=0.2,
            num_microbatches=4,
            pipeline_schedule="gpipe",
            step_time_median_s=1.28,
        ),
        _row(
            "broken",
            4,
            None,
            status="failed",
            error="out of memory",
            mesh_shape=[4, 1, 1],
            memory_bytes_per_device=None,
        ),
        _row(
            "too big",
            16,
            400.0,
            mesh_shape=[16, 1, 1],
            memory_bytes_per_device=1 << 20,
            collective_bytes_per_device=1 << 20,
        ),
    ]


def _predictions():
    return [
        _predicted_row("one", 110.0, efficiency=1.0),  # +10%
        _predicted_row("two", 160.0, memory=5 << 20, efficiency=0.8),  # -20%, memory +25%
        _predicted_row("pipe", 75.0, schedule_bubble=0.25),  # +50%
        _predicted_row("broken", 300.0),  # measured failed: no error
        _predicted_row("too big", None, status="failed", error="needs 16 devices, fake has 8"),
    ]


def test_predictions_merged_with_their_errors():
    rows = predicted.merge_predictions(_measured_rows(), _predictions())
    got = {r.name: r for r in rows}
    assert got["one"].predicted_error == pytest.approx(0.1)
    assert got["two"].predicted_error == pytest.approx(-0.2)
    assert got["two"].predicted_memory_error == pytest.approx(0.25)
    assert got["one"].predicted_memory_error == 0.0
    assert got["pipe"].predicted_error == pytest.approx(0.5)
    assert got["pipe"].predicted_bubble == 0.25 and got["one"].predicted_bubble is None
    assert got["pipe"].measured_bubble == 0.4  # the measurement is left as it was
    assert got["two"].predicted_step_time_s == pytest.approx(0.4)
    assert got["two"].predicted_compute_s == pytest.approx(0.2)
    assert got["two"].predicted_overhead_s == pytest.approx(0.05)
    assert got["two"].predicted_memory_bytes_per_device == 5 << 20
    assert got["broken"].predicted_images_per_sec == 300.0
    assert got["broken"].predicted_error is None  # nothing measured to compare with
    big = got["too big"]
    assert big.predicted_status == "failed" and big.predicted_error is None
    assert big.predicted_failure == "needs 16 devices, fake has 8"
    assert big.predicted_memory_bytes_per_device is None  # a failed prediction: no figures
    assert got["one"].predicted_failure is None and got["one"].predicted_profile == "fake"
    new = set(predicted.PREDICTED.values()) | {"predicted_error", "predicted_memory_error"}
    assert new <= set(results.KEYS)
    header = results.to_csv(rows).splitlines()[0].split(",")
    assert "predicted_error" in header and "predicted_memory_error" in header


def test_prediction_summary_and_table_on_known_rows():
    rows = predicted.merge_predictions(_measured_rows(), _predictions())
    s = predicted.prediction_summary(rows)
    assert s.n == 3  # one, two, pipe: the failed measurement and prediction are left out
    assert s.median_abs_error == pytest.approx(0.2)
    assert s.mean_abs_error == pytest.approx(0.8 / 3)
    assert (s.worst, s.worst_error) == ("pipe", pytest.approx(0.5))
    # measured 100, 200, 50 against predicted 110, 160, 75: the same order
    assert s.spearman == pytest.approx(1.0)
    line = predicted.summary_line(rows)
    assert line == (
        "images/sec error over the 3 rows with both figures: median |error| 20.0%, mean "
        "|error| 26.7%, worst pipe (+50.0%); Spearman rank correlation of predicted against "
        "measured images/sec: 1.00"
    )
    md = predicted.predicted_markdown(rows, "fake.py")
    lines = md.splitlines()
    assert (
        "| one | (1,1,1) | 100.0 | 110.0 | +10.0% | 640.0 | 581.8 (290.9 / 145.5 / 72.7 / 72.7) |  | 8.00 / 8.00 (+0.0%) |"
        in lines
    )
    assert (
        "| two | (2,1,1) | 200.0 | 160.0 | -20.0% | 320.0 | 400.0 (200.0 / 100.0 / 50.0 / 50.0) |  | 4.00 / 5.00 (+25.0%) |"
        in lines
    )
    assert "| pipe | (1,2,1) | 50.0 | 75.0 | +50.0% | 1280.0 |" in md and "| 0.400 / 0.250 |" in md
    assert "| broken | (4,1,1) | failed: out of memory | 300.0 |  |  |" in md
    assert "| too big | (16,1,1) | 400.0 | failed: needs 16 devices, fake has 8 |  |" in md
    assert md.rstrip().endswith(line) and "published eff." not in md
    assert "[clock]" in md and "[exact]" in md
    rows[1] = dataclasses.replace(rows[1], reference_efficiency=0.9)  # three more columns
    md = predicted.predicted_markdown(rows, "fake.py")
    assert "| predicted eff. | published eff. | predicted - published |" in md
    assert "| 80.0% | 90.0% | -10.0 pt |" in md


def test_prediction_summary_without_any_pair():
    rows = predicted.merge_predictions(_measured_rows()[3:], _predictions()[3:])
    assert predicted.prediction_summary(rows).n == 0
    assert predicted.summary_line(rows) == (
        "images/sec error: no row has both a measured and a predicted images/sec"
    )
    assert "| broken |" in predicted.predicted_markdown(rows, "fake.py")


def test_predicted_vs_measured_plot(tmp_path, monkeypatch):
    rows = predicted.merge_predictions(_measured_rows(), _predictions())
    figures = _drawn(monkeypatch)
    made = plots.plot_all(rows, str(tmp_path))
    path = tmp_path / "predicted_vs_measured.png"
    assert str(path) in made and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # (measured, predicted) per family, the rows that have both; y = x from 50 / 1.5 to 200 x 1.5
    (ax,) = figures["predicted_vs_measured.png"].axes
    _assert_series(
        _series(ax),
        {
            "1 device": [[100, 110]],
            "data": [[200, 160]],
            "pipeline": [[50, 75]],
            "predicted = measured": [[100 / 3, 100 / 3], [300, 300]],
        },
    )
    (band,) = [c for c in ax.collections if c.get_label() == "±15%"]  # around y = x
    x, y = np.concatenate([p.vertices for p in band.get_paths()]).T
    assert sorted({round(v, 6) for v in y / x}) == [0.85, 1.15]
    # the worst three named with their errors; median |error| of 10%, 20%, 50%; the predicted
    # order (75, 110, 160) is the measured one (50, 100, 200)
    assert sorted(t.get_text() for t in ax.texts) == ["one (+10%)", "pipe (+50%)", "two (-20%)"]
    assert ax.get_title().endswith("3 rows: median |error| 20.0%, Spearman rho 1.00")
    bare = tmp_path / "bare"
    bare.mkdir()
    made = plots.plot_all(_measured_rows(), str(bare))  # no predictions: no such plot
    assert not (bare / "predicted_vs_measured.png").exists()
    assert "predicted_vs_measured.png" not in [os.path.basename(p) for p in made]
    assert "bubble.png" in [os.path.basename(p) for p in made]  # the other plots still drawn


def test_repredicting_a_measured_sweep_measures_nothing(fake, monkeypatch, capsys):
    """A rerun with --predict (another profile each time) runs no row and is not refused by
    the manifest; the predictions and their errors land in results.json / .csv and
    predicted.md. The predictor's process is faked: it writes a known predictions.json."""
    from jaxpar.bench import runner

    suite, out, ran = fake
    _sweep(suite, out, overrides={"model.width": 0.125})
    calls = []

    def predictor(cmd, **kwargs):
        calls.append(cmd)
        dest = cmd[cmd.index("--out") + 1]
        profile = cmd[cmd.index("--profile") + 1]
        rows = [_predicted_row(n, 202.0) for n in ("1 device", "data 2", "data 3", "tensor 2")]
        write_json(
            os.path.join(dest, "predictions.json"),
            {"rows": [{**r, "profile": profile} for r in rows]},
        )
        return 0

    monkeypatch.setattr(runner.subprocess, "call", predictor)
    for profile in ("a.py", "b.py"):
        _sweep(suite, out, overrides={"model.width": 0.125}, predict=profile)
        assert ran == ["1 device", "data 2", "data 3", "tensor 2"]  # nothing measured again
        stored = {r["name"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
        assert stored["1 device"]["predicted_profile"] == profile
        assert stored["1 device"]["predicted_error"] == pytest.approx(202.0 / 101.0 - 1)
        assert stored["tensor 2"]["predicted_error"] == pytest.approx(202.0 / 104.0 - 1)
        assert f"Predicted on {profile} ({profile})" in (out / "predicted.md").read_text()
    assert [c[c.index("--profile") + 1] for c in calls] == ["a.py", "b.py"]
    assert "--config.model.width=0.125" in calls[0]
    assert "predicted_error" in (out / "results.csv").read_text().splitlines()[0]
    said = capsys.readouterr().out
    assert said.count("(4 already measured: skipped)") == 2 and "predicting 4 rows" in said
    # --out alone (no --suite, no --config) takes both from OUT/sweep.json
    assert bench_main(["--out", str(out), "--predict", "c.py", "--no_plots"]) == 0
    assert ran == ["1 device", "data 2", "data 3", "tensor 2"] and len(calls) == 3
    assert "(4 already measured: skipped)" in capsys.readouterr().out


def test_results_table_shows_mfu_only_where_a_peak_is_known():
    """On a GPU (a device whose peak jaxpar knows) the table carries model FLOPs utilisation;
    on simulated CPU devices (mfu None) the column is left out."""
    gpu = bench_row(
        name="data 8",
        mesh_shape=[8, 1, 1],
        num_devices=8,
        images_per_sec=1000.0,
        status="ok",
        mfu=0.4123,
        input_bound=False,
    )
    cpu = dataclasses.replace(gpu, mfu=None)
    with_mfu = table.markdown([gpu])
    assert "| MFU [clock] |" in with_mfu and "| 41.2% |" in with_mfu
    assert "MFU" not in table.markdown([cpu])
    header = next(line for line in with_mfu.splitlines() if line.startswith("| row"))
    row = next(line for line in with_mfu.splitlines() if line.startswith("| data 8"))
    assert header.count("|") == row.count("|")
