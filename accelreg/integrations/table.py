"""The integrations table: every host library accelreg integrates with, in one place.

Each row is an :class:`~.seams.Integration` — the library, the module whose import enables it
(``trigger``), the releases it serves, the exact releases the release matrix runs, and its seams,
each with adapters that declare the releases they serve and the shape they match. Everything that
describes the integrations reads this table: :func:`accelreg.integrations.status` and
``accelreg env``, the conflict report (a release outside the table is named before anything is
patched), docs/compatibility.md (``python tools/compat.py table``; a test fails when it is stale),
and the release sets of ``noxfile.py``.

Rows come from two places:

* the built-ins, :data:`BUILTIN` (``accelreg.integrations.<name>``);
* third parties, through the ``accelreg.integrations`` entry-point group
  (:data:`ENTRY_POINT_GROUP`): the entry-point *name* is the module whose import enables the
  integration (so a job process's start-up hook knows what to watch without importing anything),
  the value names the ``Integration`` object (``"fooml.accelreg:INTEGRATION"``); that object's
  ``trigger`` must be the same module. An external integration with a built-in's name replaces
  it (the library's own authors know it best); two external ones with one name are an error
  naming both distributions. One that fails to load is recorded (``accelreg env`` shows it) and
  skipped; in strict mode it raises.

Only :func:`triggers` is cheap enough for a job process's start-up (a static dict and an
entry-point scan); everything else imports the integration modules, which import nothing of
their libraries.
"""

from __future__ import annotations

import _thread
import importlib

from ..entrypoints import Found, find

# ``typing`` is not imported at run time: :func:`triggers` runs at a job process's start-up.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .seams import Integration

__all__ = [
    "BUILTIN",
    "ENTRY_POINT_GROUP",
    "FOLLOWERS",
    "LoadFailure",
    "failures",
    "integration",
    "integrations",
    "names",
    "release_sets",
    "reset",
    "triggers",
]

#: The entry-point group third parties register integrations in (name: the trigger module).
ENTRY_POINT_GROUP = "accelreg.integrations"

#: The built-in integrations, in the order ``install()`` enables them: name -> the library module
#: whose import enables it (each module's ``INTEGRATION.trigger``, kept here statically so a job
#: process's start-up hook imports no integration before its library). transformers imports its
#: submodules lazily, so ``modeling_utils`` is safe there; ``ray/__init__`` does not import
#: ``ray.train``.
BUILTIN: dict[str, str] = {
    "accelerate": "accelerate",
    # accelerate's command line (launch, config default, env): the ``accelerate`` command imports
    # every command module; a training process that imports accelerate never loads them.
    "accelerate_launch": "accelerate.commands.launch",
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
    # torch.accelerator answers the registry's backend: a follower (see FOLLOWERS).
    "torch_accelerator": "torch.accelerator",
}

#: The built-in rows that are *followers* (``Integration.follower``): ``install()`` enables them,
#: but their trigger's import does not make an armed job process's start-up hook call
#: ``install()`` — every process imports torch, and only a host library's import pays for
#: ``install()`` (each host library imports torch first, so the follower is enabled with it).
#: Kept here statically, as the triggers are, for the start-up hook; a test checks each row agrees.
FOLLOWERS: frozenset[str] = frozenset({"torch_accelerator"})


class LoadFailure:
    """A third-party integration that could not be loaded: the entry point, its distribution and why."""

    __slots__ = ("distribution", "entry_point", "reason")

    def __init__(self, entry_point: str, distribution: str, reason: str) -> None:
        self.entry_point = entry_point
        self.distribution = distribution
        self.reason = reason

    def as_dict(self) -> dict[str, str]:
        """Plain data for ``accelreg env --json``."""
        return {"entry_point": self.entry_point, "distribution": self.distribution, "reason": self.reason}

    def __repr__(self) -> str:
        return f"LoadFailure({self.entry_point!r}, {self.distribution!r}, {self.reason!r})"


_lock = _thread.RLock()  # not threading: read at a job process's start-up
_loaded: dict[str, Integration] | None = None
_failures: list[LoadFailure] = []


def _external() -> list[Found]:
    return find(ENTRY_POINT_GROUP)


def triggers() -> tuple[str, ...]:
    """The modules whose first import enables an integration: the built-ins' (but the
    :data:`FOLLOWERS`') and the third parties' entry-point names. Imports nothing: what a job
    process's start-up hook watches."""
    out = [trigger for name, trigger in BUILTIN.items() if name not in FOLLOWERS]
    out += [ep.name for ep in _external() if ep.name not in out]
    return tuple(out)


def _load() -> dict[str, Integration]:
    """Name -> integration for every row (built-ins first, in :data:`BUILTIN`'s order)."""
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        from .seams import Integration

        rows: dict[str, Integration] = {
            name: importlib.import_module(f"{__package__}.{name}").INTEGRATION for name in BUILTIN
        }
        owners: dict[str, str] = {}
        failures: list[LoadFailure] = []
        for ep in _external():
            try:
                obj = ep.load()
            except Exception as exc:  # noqa: BLE001 - a broken third-party integration is recorded
                failures.append(LoadFailure(ep.name, ep.distribution, f"{type(exc).__name__}: {exc}"))
                continue
            problem = _problem(obj, ep, Integration)
            if problem is None and obj.name in owners:
                problem = (
                    f"integration {obj.name!r} is registered by both {owners[obj.name]} and "
                    f"{ep.distribution}; uninstall one of them"
                )
                rows.pop(obj.name, None)
            if problem is not None:
                failures.append(LoadFailure(ep.name, ep.distribution, problem))
                continue
            owners[obj.name] = ep.distribution
            rows[obj.name] = obj  # replaces a built-in of the same name
        _failures[:] = failures
        _loaded = rows
        return rows


def _problem(obj: Any, ep: Found, cls: type) -> str | None:
    if not isinstance(obj, cls):
        return f"{ep.value} is a {type(obj).__name__}, not an accelreg Integration"
    if obj.trigger != ep.name:
        return (
            f"the entry-point name must be the module whose import enables the integration: "
            f"{ep.name!r} is not its trigger {obj.trigger!r}"
        )
    return None


def names() -> list[str]:
    """Every integration's name: the built-ins, then the third parties'."""
    return list(_load())


def integration(name: str) -> Integration:
    """The integration called ``name`` (importing its module, which imports nothing of the
    library itself); ``KeyError`` naming the known ones."""
    rows = _load()
    if name not in rows:
        raise KeyError(f"no integration named {name!r}; known: {', '.join(rows)}")
    return rows[name]


def integrations() -> list[Integration]:
    """Every row of the table, in order."""
    return list(_load().values())


def failures() -> list[LoadFailure]:
    """The third-party integrations that could not be loaded (after the table was read)."""
    _load()
    return list(_failures)


def reset() -> None:
    """Forget the loaded table (tests that install or remove a third-party integration)."""
    global _loaded
    with _lock:
        _loaded = None
        _failures.clear()


def release_sets() -> dict[str, dict[str, str]]:
    """Release-matrix set -> {distribution: release}, from every row's ``tested`` releases (what
    ``noxfile.py`` layers). Rows of one distribution (Ray Core and Ray Train) must agree."""
    sets: dict[str, dict[str, str]] = {}
    for integ in integrations():
        for set_name, release in integ.tested.items():
            pins = sets.setdefault(set_name, {})
            if pins.setdefault(integ.distribution, release) != release:
                raise ValueError(
                    f"the {set_name} set pins {integ.distribution} {pins[integ.distribution]} and "
                    f"{release} (integration {integ.name}): rows of one library must agree"
                )
    return sets
