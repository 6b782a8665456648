"""Integrations: the host libraries ask the registry.

Every integration has one shape (:class:`~._seams.Integration`): a module
``accelreg.integrations.<name>`` holding the library's seams, one ``INTEGRATION`` object, and
``enable, disable, enabled = INTEGRATION.api()``. Adding a host library is writing that module
and naming it, with the module whose import enables it, in :data:`HOSTS`; nothing else changes.

:func:`install` enables every integration whose library is installed — each at the moment its
library is imported, so ``install()`` itself imports none of them — and nothing it runs inside
that import can raise into the user's ``import`` statement.

This package's ``__init__`` is cheap on purpose (it imports only the import hooks): a process
under ``accelreg run`` imports it at start-up (:mod:`accelreg.launch.startup`) and must not pay
for the registry or any integration module before a host library is imported. The rest is
served by name (:func:`integration`, and ``IntegrationWarning``/``raise_recorded`` from
:mod:`._seams` on first use).
"""

from __future__ import annotations

import importlib

from . import _postimport

# ``typing`` is not imported at run time: the start-up hook imports this in every job process.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ._seams import Integration, IntegrationWarning, raise_recorded

__all__ = [
    "HOSTS",
    "INTEGRATIONS",
    "IntegrationWarning",
    "install",
    "integration",
    "raise_recorded",
    "status",
    "uninstall",
]

#: The host libraries, in the order ``install()`` enables them: the name of each integration
#: module (``accelreg.integrations.<name>``) and the library module whose import enables it —
#: one imported only once its package is complete (firing on a submodule the package
#: ``__init__`` is still importing would make ``enable()`` import from a partially initialised
#: package). transformers imports its submodules lazily, so ``modeling_utils`` is safe there;
#: ``ray/__init__`` does not import ``ray.train``.
HOSTS: dict[str, str] = {
    "accelerate": "accelerate",
    "transformers": "transformers.modeling_utils",
    "peft": "peft",
    "deepspeed": "deepspeed",
    # Ray Core (its accelerator managers) on ``import ray``; Ray Train's seams import torch, so
    # they wait for Ray Train's torch package (a Ray worker that runs only tasks never pays).
    "ray": "ray",
    "ray_train": "ray.train.torch",
    # Lightning under each of its import names; each patches only its own package.
    "lightning": "lightning",
    "lightning_fabric": "lightning_fabric",
    "pytorch_lightning": "pytorch_lightning",
    # vLLM chooses its platform once per process, when ``vllm.platforms`` is first asked for it:
    # the seam must be in place as that module finishes loading (vllm/__init__ does not import it).
    "vllm": "vllm.platforms",
}

#: name -> (integration module, trigger): :data:`HOSTS` with each module's full name.
INTEGRATIONS: dict[str, tuple[str, str]] = {name: (f"{__name__}.{name}", t) for name, t in HOSTS.items()}

_SEAMS = f"{__name__}._seams"


def __getattr__(name: str) -> Any:
    if name in ("IntegrationWarning", "raise_recorded"):
        value = getattr(importlib.import_module(_SEAMS), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def integration(name: str) -> Integration:
    """The :class:`~._seams.Integration` of host library ``name`` (importing its module, which
    imports nothing of the library itself)."""
    if name not in HOSTS:
        raise KeyError(f"no integration named {name!r}; known: {', '.join(HOSTS)}")
    return importlib.import_module(INTEGRATIONS[name][0]).INTEGRATION


def _library_installed(trigger: str) -> bool:
    import importlib.util  # not at start-up: this package is imported in every job process

    try:
        return importlib.util.find_spec(trigger.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False


def install() -> list[str]:
    """Enable every integration whose library is installed; returns their names.

    An integration is enabled when its library module is first imported (or now, if it
    already is); a seam that matches no adapter is skipped with an
    :class:`IntegrationWarning`, and nothing raised there reaches the user's ``import``. In
    strict mode (``ACCELREG_STRICT=1`` / ``configure(strict=True)``) every installed library is
    imported and enabled *now*, so a seam that matches no adapter raises
    :class:`~accelreg.errors.IntegrationError` from this call; the integrations it enabled
    are disabled again first, so a failed ``install()`` leaves nothing half-installed.
    """
    from ._seams import enable_in_hook, raise_recorded, strict_mode

    raise_recorded()
    strict = strict_mode()
    chosen: list[Integration] = []
    installed = {name: trigger for name, trigger in HOSTS.items() if _library_installed(trigger)}
    before = {name for name in installed if integration(name).enabled}
    try:
        for name, trigger in installed.items():
            integ = integration(name)
            chosen.append(integ)
            if integ.prepare is not None:
                integ.prepare()  # work that must happen before the library first runs (imports nothing)
            if strict:
                importlib.import_module(trigger)
                integ.enable()  # reads the strict setting: raises on a seam it cannot match
            else:
                _postimport.when_imported(trigger, lambda _module, i=integ: enable_in_hook(i))
    except BaseException:
        for integ in chosen:
            _postimport.cancel(HOSTS[integ.name])
            if integ.name not in before:
                integ.disable()
        raise
    return [integ.name for integ in chosen]


def uninstall() -> None:
    """Disable every integration and forget pending ones."""
    for name, trigger in HOSTS.items():
        _postimport.cancel(trigger)
        integ = integration(name)
        if integ.unprepare is not None:
            integ.unprepare()
        integ.disable()


def status() -> list[dict[str, Any]]:
    """One entry per integration, for this process: ``name``, ``library``, installed ``version``,
    tested releases (``supported``) and whether the version is among them (``in_range``),
    ``seams`` (each seam's adapter, or none), ``skipped``, ``all_match``, ``enabled``,
    ``pending`` (install() is waiting for ``trigger`` to be imported), ``install`` (what
    install() did or would do, in words) and ``note``."""
    out = []
    for name, trigger in HOSTS.items():
        item = integration(name).status()
        item["trigger"] = trigger
        item["pending"] = _postimport.pending(trigger)
        item["install"] = _install_effect(item)
        out.append(item)
    return out


def _install_effect(item: dict[str, Any]) -> str:
    """What :func:`install` did, or would do, for one integration in this process."""
    trigger, version = item["trigger"], item.get("version")
    if version is None:
        return "library not installed: install() skips it"
    skipped = item.get("skipped") or []
    partly = f", skipping {len(skipped)} seam(s) that match no adapter (one warning each)" if skipped else ""
    if item["enabled"]:
        return "enabled in this process" + partly
    if item["pending"]:
        return f"install() was called: enabled when {trigger} is imported{partly}"
    return f"install() would enable it (when {trigger} is imported){partly}"
