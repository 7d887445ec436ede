"""The GPU image's import surface, for `scripts/gpu_session.sh --dry-run` (scripts/gpu_image.py).

Python imports this at start-up when this directory is on PYTHONPATH. With GPU_IMAGE_ALLOW set (the
comma-separated top-level modules the image has), a top-level import that would come from this
machine's site-packages and is not on that list fails with ModuleNotFoundError, as it would on the
image; the standard library, the checkout and the carried wheels' target directory (not a
site-packages directory) import as usual. Child Python processes inherit PYTHONPATH, so they get the
same rule."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import site
import sys

_ALLOW = frozenset(filter(None, os.environ.get("GPU_IMAGE_ALLOW", "").split(",")))
_SITE_DIRS = tuple(os.path.realpath(d) + os.sep for d in [*site.getsitepackages(), site.getusersitepackages()])


class _GpuImageOnly(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if "." in name or name in _ALLOW or name in sys.stdlib_module_names or name in sys.builtin_module_names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None:
            return None
        where = (
            spec.origin
            if spec.origin not in (None, "namespace")
            else next(iter(spec.submodule_search_locations or []), None)
        )
        if where and os.path.realpath(where).startswith(_SITE_DIRS):
            raise ModuleNotFoundError(
                f"No module named '{name}' (the GPU image does not have it, and no carried "
                f"wheel installs it: scripts/gpu_session.sh --dry-run)",
                name=name,
            )
        return None


if _ALLOW:
    sys.meta_path.insert(0, _GpuImageOnly())
