"""Module paths that moved when the integrations became one folder per host library (0.3.0).

Every old path still imports, as the very module at its new place (one object: patching or
reading either name is the same thing), with a :class:`DeprecationWarning` naming the new path.
They go in 0.4.0. ``accelreg.integrations.table`` and ``.census`` are not deprecated: the table
and the census of device branches are part of the package's face (``from accelreg.integrations
import table``).

A finder on ``sys.meta_path`` answers only the names below; it imports nothing until one of
them is imported (this module is loaded with the package, at every job process's start-up).
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec
    from typing import Any

__all__ = ["MOVED", "install_aliases"]

#: Old module (under ``accelreg.integrations``) -> its new place, and whether the old path is
#: deprecated (it warns) or a second name kept on purpose.
MOVED: dict[str, tuple[str, bool]] = {
    "table": ("_machinery.table", False),
    "census": ("_machinery.census", False),
    "seams": ("_machinery.seams", True),
    "releases": ("_machinery.releases", True),
    "_shapes": ("_machinery.shapes", True),
    "accelerate_launch": ("accelerate.launch", True),
    "ds_accelerator": ("deepspeed.accelerator", True),
    "lightning_accelerator": ("lightning.accelerator", True),
    "lightning_fabric": ("lightning.fabric", True),
    "pytorch_lightning": ("lightning.pytorch_lightning", True),
    "ray_train": ("ray.train", True),
    "torch_accelerator": ("torch", True),
    "vllm_platform": ("vllm.platform", True),
    "vllm_worker": ("vllm.worker", True),
    "vllm_attention": ("vllm.attention", True),
}

#: The release that removes the deprecated paths.
REMOVED_IN = "0.4.0"


class _Alias:
    """Loader of one old path: hands back the module at its new place."""

    def __init__(self, new: str, deprecated: bool) -> None:
        self.new = new
        self.deprecated = deprecated

    def create_module(self, spec: ModuleSpec) -> Any:
        import importlib

        if self.deprecated:
            import warnings

            warnings.warn(
                f"{spec.name} moved to {self.new} in accelreg 0.3.0; the old path goes in {REMOVED_IN}",
                DeprecationWarning,
                stacklevel=_caller_level(),
            )
        return importlib.import_module(self.new)

    def exec_module(self, module: Any) -> None:
        """Nothing to run: the module at the new place is already imported."""


class _Finder:
    def __init__(self, package: str) -> None:
        self.prefix = package + "."

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if not fullname.startswith(self.prefix):
            return None
        moved = MOVED.get(fullname[len(self.prefix) :])
        if moved is None:
            return None
        from importlib.machinery import ModuleSpec

        new, deprecated = moved
        return ModuleSpec(fullname, _Alias(self.prefix + new, deprecated))


def _caller_level() -> int:
    """The stack level of the first frame outside importlib (the user's ``import``)."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and (
        frame.f_code.co_filename.startswith("<frozen importlib")
        or frame.f_globals.get("__name__") == __name__
    ):
        frame = frame.f_back
        level += 1
    return level


def install_aliases(package: str) -> None:
    """Answer the old paths under ``package`` (idempotent)."""
    if not any(isinstance(f, _Finder) and f.prefix == package + "." for f in sys.meta_path):
        sys.meta_path.append(_Finder(package))
