"""The strategy protocol is the one description of a step: a strategy written outside jaxpar
(tests/example_strategy.py, one module plus one registry line) trains like one device and is
read by the analysis, --explain and the predictor unchanged; and nothing outside `parallel`
looks inside a strategy."""

from __future__ import annotations

import ast
import pathlib

import jax
import numpy as np
import pytest

from jaxpar import analysis, collectives, explain, parallel
from jaxpar.config import ConfigError
from jaxpar.predict.programs.workload import strategy_for, workload
from tests.example_strategy import GSPMDData
from tests.util import max_rel_error, reference_run, run_steps, tiny_config

ROOT = pathlib.Path(__file__).resolve().parents[1] / "jaxpar"


@pytest.fixture
def gspmd(monkeypatch):
    monkeypatch.setitem(parallel.STRATEGIES, "gspmd", GSPMDData)  # the registry line
    return tiny_config(strategy="gspmd", mesh_shape=(4, 1, 1))


def test_an_added_strategy_trains_like_one_device(gspmd):
    ref_losses, ref_state = reference_run(tiny_config())
    losses, state = run_steps(gspmd, 4)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    assert max_rel_error(state.params, ref_state.params) < 1e-5


def test_analysis_explain_and_predictor_read_an_added_strategy(gspmd):
    strategy = strategy_for(gspmd)
    assert isinstance(strategy, GSPMDData)
    fig = analysis.report(strategy, 16)
    # XLA put in the gradient all-reduce itself; the analysis finds it over the data axis:
    # every gradient once (as many bytes as the parameters), plus the loss and accuracy.
    grads = collectives.by_kind_axis(fig["collectives"], "step", "all-reduce", "data")
    assert grads == fig["param_bytes"] + 2 * 4
    assert fig["param_bytes_per_device"] == fig["param_bytes"]  # replicated
    text = explain.explain(gspmd, jax.devices()[:4])
    assert "strategy gspmd data" in text and "all-reduce" in text
    w = workload(gspmd)
    per_device = w.stage_flops()[0]  # the predictor's cost: the compiled step, per device
    assert per_device * 4 == pytest.approx(analysis.step_flops(strategy, 16))
    # ... a forward and a backward (at most twice the forward) of a quarter of the batch
    forward = 16 * strategy.model.flops_per_example / 4
    assert 2 * forward < per_device <= 3 * forward


def test_strategy_names_are_checked_against_the_mesh():
    with pytest.raises(
        ConfigError,
        match=r"strategy=data splits the batch only, but the mesh "
        r"\(data=2, stage=2, tensor=1\) has stage > 1; use "
        r"--config.mesh_shape='\(4,1,1\)'",
    ):
        parallel.validate(tiny_config(strategy="data", mesh_shape=(2, 2, 1)), 4)
    with pytest.raises(ConfigError, match="unknown strategy 'gspmd'"):
        parallel.validate(tiny_config(strategy="gspmd"), 8)
    # a named strategy on a mesh it fits: the resolved mesh comes back, -1 filled in, in order
    shape = parallel.validate(tiny_config(strategy="tensor", mesh_shape=(-1, 1, 1)), 4)
    assert list(shape.items()) == [("data", 4), ("stage", 1), ("tensor", 1)]
    shape = parallel.validate(tiny_config(strategy="pipeline", mesh_shape=(1, -1, 2)), 8)
    assert list(shape.items()) == [("data", 1), ("stage", 4), ("tensor", 2)]


def _modules() -> dict[str, ast.Module]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = ast.parse(path.read_text())
    return out


def _imports(name: str, tree: ast.Module, known) -> set[str]:
    """jaxpar modules `name` imports, anywhere in it (a late import inside a function counts:
    it only hides a cycle)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("jaxpar"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in known else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("jaxpar")}
    return (found & set(known)) - {name}


def test_jaxpar_imports_form_no_cycle():
    modules = _modules()
    graph = {n: _imports(n, t, modules) for n, t in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                cycles.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    assert len(graph) > 60 and graph["jaxpar.trainer"]  # the graph was read
    assert cycles == []


READERS = (
    "jaxpar.analysis",
    "jaxpar.collectives",
    "jaxpar.explain",
    "jaxpar.bench",
    "jaxpar.predict",
)
STRATEGY_CLASSES = {"DataParallel", "PmapDataParallel", "TensorParallel", "Pipeline"}


def test_readers_use_only_the_protocol():
    """The analysis, --explain, the bench and the predictor see a strategy through its
    protocol: no isinstance on a strategy class, no private attribute, no strategy module."""
    for name, tree in _modules().items():
        if not name.startswith(READERS):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith(
                    (
                        "jaxpar.parallel.pipeline",
                        "jaxpar.parallel.data",
                        "jaxpar.parallel.pmap",
                        "jaxpar.parallel.tensor_parallel",
                        "jaxpar.parallel.sync",
                    )
                ), f"{name} imports {node.module}"
            if isinstance(node, ast.Name) and node.id in STRATEGY_CLASSES:
                pytest.fail(f"{name} names {node.id}")
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "strategy"
            ):
                assert not node.attr.startswith("_"), f"{name} reads strategy.{node.attr}"
