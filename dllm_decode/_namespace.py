"""The plugin folders beside `dllm_decode/` install as `dllm_decode.<name>`, never bare.

`schedulers/`, `caches/`, `filters/` and `eval/` sit at the repository root (the design card's
layout); `pyproject.toml` maps them to `dllm_decode.schedulers` and so on, for the wheel and the
editable install alike. Generic top-level names collide with other distributions (PyPI's `filters`
and `caches`) and with a user's own `eval.py`, so each folder refuses its bare name: no file is
importable under two names, even from the repository root where the folders are on `sys.path`.
"""

from __future__ import annotations


def require_namespaced(name: str) -> None:
    """Raise ImportError unless a plugin package was imported as `dllm_decode.<name>`."""
    if not name.startswith("dllm_decode."):
        raise ImportError(f"import {name!r} as 'dllm_decode.{name}' (the bare name is not "
                          f"dllm-decode's: it belongs to other packages and to your own code)")


def import_from_checkout() -> None:
    """In an uninstalled checkout (a copy on a device machine, `python -m pytest` from the root),
    make `dllm_decode.eval`, `.schedulers`, `.caches` and `.filters` resolve to the root folders,
    as the installed package maps them; a no-op where they already import."""
    import importlib
    import importlib.util
    from pathlib import Path

    package = importlib.import_module("dllm_decode")
    if importlib.util.find_spec("dllm_decode.eval") is not None:
        return
    root = Path(package.__file__).resolve().parents[1]
    if (root / "eval" / "__init__.py").is_file() and str(root) not in package.__path__:
        package.__path__.append(str(root))
