"""The one-way import rule on the installed names: core <- plugins <- eval, and no import circles.

Core is `dllm_decode/` (the loop, records, models, the AR mode); the plugins are
`dllm_decode.schedulers`, `.caches`, `.filters` (folders at the repository root); `dllm_decode.eval`
sits on top; the CLI package (`dllm_decode/cli/`) is the edge that may import everything.
"""

from __future__ import annotations

import ast
import pathlib

import dllm_decode

ROOT = pathlib.Path(dllm_decode.__file__).resolve().parent.parent
PLUGINS = ("dllm_decode.schedulers", "dllm_decode.caches", "dllm_decode.filters")
EVAL = "dllm_decode.eval"
FOLDERS = {"dllm_decode": ROOT / "dllm_decode", "dllm_decode.schedulers": ROOT / "schedulers",
           "dllm_decode.caches": ROOT / "caches", "dllm_decode.filters": ROOT / "filters",
           "dllm_decode.eval": ROOT / "eval", "tests": ROOT / "tests"}


def module_name(path: pathlib.Path) -> str:
    """The installed dotted name of a source file."""
    for package, folder in sorted(FOLDERS.items(), key=lambda kv: -len(kv[0])):
        if folder in path.parents:
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            return ".".join([package, *parts])
    raise ValueError(path)


def source_files() -> list[pathlib.Path]:
    files = [p for p in (ROOT / "dllm_decode").rglob("*.py")]
    for name in ("schedulers", "caches", "filters", "eval"):
        files += list((ROOT / name).rglob("*.py"))
    return [p for p in files if "embedded" not in p.parts and "lm_eval_tasks" not in p.parts]


def imports_of(path: pathlib.Path) -> set[str]:
    """Absolute dotted names a file imports (relative imports resolved)."""
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            out |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return out


def is_core(name: str) -> bool:
    return name.startswith("dllm_decode") and not name.startswith(
        (*PLUGINS, EVAL, "dllm_decode.cli"))


def test_core_never_imports_plugins_or_eval():
    offenders = [str(p.relative_to(ROOT)) for p in source_files() if is_core(module_name(p))
                 and any(n.startswith((*PLUGINS, EVAL)) for n in imports_of(p))]
    assert not offenders, f"core files import a plugin package or eval: {offenders}"


def test_plugins_never_import_eval_or_cli():
    offenders = [str(p.relative_to(ROOT)) for p in source_files()
                 if module_name(p).startswith(PLUGINS)
                 and any(n.startswith((EVAL, "dllm_decode.cli")) for n in imports_of(p))]
    assert not offenders, f"plugins import eval or the CLI: {offenders}"


def test_eval_never_imports_the_cli():
    offenders = [str(p.relative_to(ROOT)) for p in source_files()
                 if module_name(p).startswith(EVAL) and any(n.startswith("dllm_decode.cli")
                                                            for n in imports_of(p))]
    assert not offenders, f"eval imports the CLI: {offenders}"


def test_no_bare_plugin_names():
    """Every import names the installed package (`dllm_decode.schedulers`, never `schedulers`)."""
    bare = ("schedulers", "caches", "filters", "eval")
    offenders = [str(p.relative_to(ROOT)) for p in [*source_files(), *(ROOT / "tests").rglob("*.py")]
                 if any(n.split(".")[0] in bare for n in imports_of(p) if n)]
    assert not offenders, f"bare plugin imports: {offenders}"


def test_no_import_circles():
    """Tarjan over the file-level import graph (a package `__init__` re-exporting is not a cycle
    of its own: edges into an `__init__` count only when the file imports the package itself)."""
    files = source_files()
    by_name = {module_name(p): p for p in files}
    graph: dict[pathlib.Path, set[pathlib.Path]] = {p: set() for p in files}
    for p in files:
        for name in imports_of(p):
            while name and name not in by_name:
                name = name.rpartition(".")[0]
            target = by_name.get(name)
            if target is not None and target != p and target.name != "__init__.py":
                graph[p].add(target)
    index: dict = {}
    low: dict = {}
    stack: list = []
    on_stack: set = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(str(w.relative_to(ROOT)))
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, f"import circles: {cycles}"
