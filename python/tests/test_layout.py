"""The package is laid out by the process its code runs in, and its imports say so.

- client/, scheduler/ and worker/ import nothing of each other: only the shared modules;
- member/ and comm/ run in a worker process and may use worker/ too; shared modules use only
  shared modules; nothing imports the entry points (cli, demo) but themselves;
- no import cycles between modules (counting the imports a module runs when it is loaded);
- `import dask_pmix` loads neither distributed nor an MPI library, and a plain MPI rank's
  `python -m dask_pmix.pmi_connect` loads nothing of Dask.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import dask_pmix

PKG = Path(dask_pmix.__file__).resolve().parent
SHARED = {"protocol", "rest", "http11", "config", "errors", "launcher", "pmi_connect", "pool", "blocks"}
ENTRY = {"cli", "demo", "__main__"}
# Which groups each group may import (besides itself and the shared modules).
ALLOWED = {
    "client": set(),
    "scheduler": set(),
    "worker": set(),
    "member": {"worker"},
    "comm": {"worker"},
    "shared": set(),
    "package": {"client", "scheduler", "worker", "comm"},  # __init__'s lazy attributes
    "entry": {"client", "scheduler", "worker", "member", "comm", "entry"},
}


# The `dask_pmix.pool` alias is the worker's pool module.
EXCEPTIONS = {("dask_pmix.pool", "dask_pmix.worker.pool"), ("dask_pmix.pool", "dask_pmix.worker")}


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in PKG.rglob("*.py")}


def group_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "package"
    if len(parts) == 2 and parts[1] in SHARED:
        return "shared"
    if len(parts) == 2 and parts[1] in ENTRY:
        return "entry"
    return parts[1]


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    if node.level:
        base = module.split(".")
        base = base if is_package else base[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    if not prefix.startswith("dask_pmix"):
        return []
    # `from pkg import name`: name is a submodule, or else an attribute of pkg.
    return [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in MODULES else prefix for a in node.names]


def imports(path: Path) -> tuple[set[str], set[str]]:
    """(every dask_pmix module it imports, those it imports when it is loaded)."""
    module = module_name(path)
    tree = ast.parse(path.read_text())
    every: set[str] = set()
    at_load: set[str] = set()

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names if a.name.startswith("dask_pmix")]
            elif isinstance(child, ast.ImportFrom):
                names = _resolve(module, path.name == "__init__.py", child)
            for name in names:
                every.add(name)
                if top:
                    at_load.add(name)
            nested = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            visit(child, top and not nested)

    visit(tree, True)
    return every, at_load


def graph() -> dict[str, tuple[set[str], set[str]]]:
    out = {}
    for name, path in MODULES.items():
        every, at_load = imports(path)
        known = lambda names: {n for n in names if n in MODULES and n != name}  # noqa: E731
        out[name] = (known(every), known(at_load))
    return out


def test_each_part_imports_only_what_its_process_may():
    wrong = []
    for module, (every, _) in graph().items():
        group = group_of(module)
        for target in every:
            tgroup = group_of(target)
            if tgroup in (group, "shared") or (module, target) in EXCEPTIONS:
                continue
            if tgroup == "package":
                wrong.append(f"{module} imports the package's lazy attributes; import the module itself")
            elif tgroup not in ALLOWED.get(group, set()):
                wrong.append(f"{module} ({group}) imports {target} ({tgroup})")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_import_cycles():
    g = {m: at_load for m, (_, at_load) in graph().items()}
    # A package's __init__ runs before its submodules: an edge into a package is an edge into it.
    seen: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(m: str) -> None:
        seen[m] = 1
        stack.append(m)
        for t in sorted(g.get(m, ())):
            if seen.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in seen:
                visit(t)
        stack.pop()
        seen[m] = 2

    for m in sorted(g):
        if m not in seen:
            visit(m)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def loaded_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport json, sys; print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_importing_the_package_is_cheap():
    mods = loaded_after("import dask_pmix; dask_pmix.__version__")
    heavy = {m for m in mods if m.split(".")[0] in {"distributed", "dask", "mpi4py", "numpy", "httpx", "yaml", "tornado"}}
    assert not heavy, sorted(heavy)[:10]


def test_a_plain_rank_binder_loads_nothing_of_dask():
    mods = loaded_after("import runpy, sys; sys.argv = ['x']; import dask_pmix.pmi_connect")
    heavy = {m for m in mods if m.split(".")[0] in {"distributed", "dask", "mpi4py", "numpy", "httpx", "yaml", "tornado"}}
    assert not heavy, sorted(heavy)[:10]


def test_the_lazy_attributes_resolve():
    for name in dask_pmix.__all__:
        assert getattr(dask_pmix, name) is not None, name
    from dask_pmix import pool as alias
    from dask_pmix.worker import pool

    assert alias is pool
