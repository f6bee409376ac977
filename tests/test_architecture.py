"""The one-way import rule: core never imports a plugin package (only cli.py may)."""

import ast
import pathlib

import dllm_decode

PLUGIN_PACKAGES = {"schedulers", "caches", "filters", "eval"}


def imported_roots(path: pathlib.Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_core_never_imports_plugins():
    core = pathlib.Path(dllm_decode.__file__).parent
    offenders = [str(p.relative_to(core)) for p in core.rglob("*.py")
                 if p.name != "cli.py" and imported_roots(p) & PLUGIN_PACKAGES]
    assert not offenders, f"core files import a plugin package: {offenders}"


def test_plugins_never_import_eval():
    root = pathlib.Path(dllm_decode.__file__).parent.parent
    offenders = [str(p) for pkg in ("schedulers", "caches", "filters")
                 for p in (root / pkg).rglob("*.py") if "eval" in imported_roots(p)]
    assert not offenders, f"plugins import eval: {offenders}"


def test_nothing_shadows_builtin_eval():
    root = pathlib.Path(dllm_decode.__file__).parent.parent
    for pkg in ("dllm_decode", "schedulers", "caches", "filters", "eval", "tests"):
        for path in (root / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    assert "eval" not in {a.name for a in node.names if a.asname is None}, path
