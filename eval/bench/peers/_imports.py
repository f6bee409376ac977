"""Import a peer's modules from its checkout, its folder first on `sys.path` for the peer's own
imports, without leaving its top-level module names behind (two peers may both have a `model`
package, and `generate` is a common name)."""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType


@contextlib.contextmanager
def peer_imports(folder: Path) -> Iterator[Callable[[str], ModuleType]]:
    """Yields `load(dotted_name)`, importing from `folder` (the peer's modules shadow any of the
    same name while the context is open, and are forgotten after it; the loaded modules stay
    usable).

    Raises:
        ImportError: a module missing from the folder, or one whose own imports fail.
    """
    if not folder.is_dir():
        raise ImportError(f"{folder} does not exist")
    root = str(folder.resolve())
    shadowed = {}

    def ours(name: str) -> bool:
        module = sys.modules.get(name)
        origin = getattr(module, "__file__", None) or ""
        return bool(origin) and str(Path(origin).resolve()).startswith(root)

    def load(name: str) -> ModuleType:
        top = name.split(".")[0]
        if top in sys.modules and not ours(top):
            shadowed[top] = sys.modules.pop(top)
        module = importlib.import_module(name)
        if not ours(name):
            raise ImportError(f"{name} did not load from {folder}")
        return module

    before = set(sys.modules)
    sys.path.insert(0, root)
    try:
        yield load
    finally:
        sys.path.remove(root)
        for name in set(sys.modules) - before:
            if ours(name):
                sys.modules.pop(name, None)
        sys.modules.update(shadowed)
