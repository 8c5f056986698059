"""Import every module of the export package, so that each bundled target module registers
itself: bundling a target is adding one module, as adding a schedule is."""

from __future__ import annotations

import importlib
import pkgutil

import hetpar.export as _package

for _module in pkgutil.iter_modules(_package.__path__):
    if _module.name not in ("__init__", "builtin"):
        importlib.import_module(f"{_package.__name__}.{_module.name}")
