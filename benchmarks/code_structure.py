"""How the code hangs together, measured from its syntax: what a maintainer's redesign moves.

Run:  python benchmarks/code_structure.py [--list]

Nothing is imported or run; every figure comes from parsing jaxpar/ with Python's ast module:

- modules, and their imports of other jaxpar modules: at the top of a file, and inside a
  function (a hidden coupling; `--list` names each one);
- cycles: groups of jaxpar packages (jaxpar/bench, jaxpar/plan, ..., or a top-level module)
  that import each other, counting imports made inside functions;
- string-key reads (`row["key"]`, `row.get("key")`) in jaxpar/bench, jaxpar/plan and
  jaxpar/predict: the reads a typed record replaces, counted apart inside the deserialisers
  (functions named `of_record`, the one place a record's keys are read); `--list` names the
  files with reads outside them;
- regular-expression calls outside jaxpar/hlo in modules that read compiled programs (HLO);
- functions that take a parameter named `config`, and the files they are in;
- lines in jaxpar/predict.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORD_PACKAGES = ("jaxpar/bench", "jaxpar/plan", "jaxpar/predict")
RE_CALLS = {"compile", "search", "match", "fullmatch", "findall", "finditer", "sub", "split"}
HLO_WORDS = ("hlo", "HLO", "replica_groups", "backend_config", "custom_call")


def python_files(folder):
    for directory, _, names in sorted(os.walk(os.path.join(ROOT, folder))):
        for name in sorted(names):
            if name.endswith(".py"):
                yield os.path.relpath(os.path.join(directory, name), ROOT)


def module_name(path):
    parts = path[: -len(".py")].split(os.sep)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def package_of(module):
    """jaxpar.plan.search -> jaxpar.plan; jaxpar.loop -> jaxpar.loop (a module is its own)."""
    parts = module.split(".")
    return ".".join(parts[:2])


def imported_modules(node, module, is_package):
    """The jaxpar modules one import statement names (relative imports resolved)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name.startswith("jaxpar")]
    if node.level:
        base = module.split(".")
        base = base if is_package else base[:-1]
        base = base[: len(base) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if not target.startswith("jaxpar"):
        return []
    return [target, *(f"{target}.{alias.name}" for alias in node.names)]


class Reader(ast.NodeVisitor):
    def __init__(self, module, is_package, known):
        self.module, self.is_package, self.known = module, is_package, known
        self.depth = 0
        self.top, self.local = set(), []
        self.key_reads = 0
        self.deserialiser_reads = 0
        self.functions = []
        self.re_calls = 0
        self.config_functions = 0

    def visit_FunctionDef(self, node):
        names = [a.arg for a in node.args.args + node.args.kwonlyargs]
        self.config_functions += "config" in names
        self.depth += 1
        self.functions.append(node.name)
        self.generic_visit(node)
        self.functions.pop()
        self.depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def _import(self, node):
        named = [t for t in imported_modules(node, self.module, self.is_package) if t in self.known]
        # `from jaxpar.plan import search` imports jaxpar.plan.search, not only the package
        targets = named[1:] if len(named) > 1 and isinstance(node, ast.ImportFrom) else named
        if not targets:
            return
        if self.depth:
            self.local.append((node.lineno, targets[-1]))
        else:
            self.top.update(targets)
        self.all_targets.update(targets)

    def visit_Import(self, node):
        self._import(node)

    def visit_ImportFrom(self, node):
        self._import(node)

    def visit_Subscript(self, node):
        key = node.slice
        if (
            isinstance(key, ast.Constant)
            and isinstance(key.value, str)
            and isinstance(node.ctx, ast.Load)
        ):
            self._key_read()
        self.generic_visit(node)

    def _key_read(self):
        if "of_record" in self.functions:
            self.deserialiser_reads += 1
        else:
            self.key_reads += 1

    def visit_Call(self, node):
        func = node.func
        if isinstance(func, ast.Attribute):
            key = node.args[0] if func.attr == "get" and node.args else None
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                self._key_read()
            if isinstance(func.value, ast.Name) and func.value.id == "re" and func.attr in RE_CALLS:
                self.re_calls += 1
        self.generic_visit(node)


def read_tree():
    paths = list(python_files("jaxpar"))
    known = {module_name(p) for p in paths}
    readers = {}
    for path in paths:
        with open(os.path.join(ROOT, path)) as f:
            source = f.read()
        module = module_name(path)
        reader = Reader(module, path.endswith("__init__.py"), known)
        reader.all_targets = set()
        reader.source = source
        reader.lines = source.count("\n")
        reader.visit(ast.parse(source))
        readers[path] = reader
    return readers


def package_cycles(readers):
    """Strongly connected groups of packages (Tarjan), imports inside functions included."""
    graph = defaultdict(set)
    for reader in readers.values():
        for target in reader.all_targets:
            a, b = package_of(reader.module), package_of(target)
            if a != b:
                graph[a].add(b)
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in list(graph):
        if node not in index:
            visit(node)
    return groups


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="name each function-local import")
    args = parser.parse_args(argv)
    sys.setrecursionlimit(10000)
    readers = read_tree()
    local = [(path, line, target) for path, r in readers.items() for line, target in r.local]
    cycles = package_cycles(readers)
    in_records = [r for p, r in readers.items() if p.startswith(RECORD_PACKAGES)]
    hlo_re = {
        p: r.re_calls
        for p, r in readers.items()
        if r.re_calls and not p.startswith("jaxpar/hlo") and any(w in r.source for w in HLO_WORDS)
    }
    config_files = [p for p, r in readers.items() if r.config_functions]
    predict_lines = sum(r.lines for p, r in readers.items() if p.startswith("jaxpar/predict"))
    print(f"modules                                   {len(readers)}")
    print(f"jaxpar imports at the top of a module     {sum(len(r.top) for r in readers.values())}")
    print(f"jaxpar imports inside a function          {len(local)}")
    print(f"package cycles                            {len(cycles)} {cycles if cycles else ''}")
    print(f"string-key reads in bench/plan/predict    {sum(r.key_reads for r in in_records)}")
    print(
        f"  and inside their deserialisers          {sum(r.deserialiser_reads for r in in_records)}"
    )
    print(
        f"re calls over HLO outside jaxpar/hlo      {sum(hlo_re.values())} in {len(hlo_re)} files"
    )
    print(
        f"functions taking `config`                 {sum(r.config_functions for r in readers.values())}"
        f" in {len(config_files)} files"
    )
    print(
        f"lines in jaxpar/predict                   {predict_lines} in "
        f"{sum(p.startswith('jaxpar/predict') for p in readers)} files"
    )
    if args.list:
        for path, line, target in local:
            print(f"  local import {path}:{line} {target}")
        for path, r in sorted(readers.items()):
            if r.key_reads and path.startswith(RECORD_PACKAGES):
                print(f"  string-key reads {path}: {r.key_reads}")
        for path, count in sorted(hlo_re.items()):
            print(f"  re over HLO {path}: {count}")


if __name__ == "__main__":
    main()
