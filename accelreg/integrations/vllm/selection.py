"""Which vLLM platform serves the registry's backend: its declared platform (one of vLLM's own, a
platform plugin's entry-point name, or a class path), ``ACCELREG_VLLM_PLATFORM``, else (none of
the declared names installed) the one active platform plugin whose platform's ``device_type`` is
the backend's torch device type, else accelreg's registry platform; failures recorded, never a
silent fall back to the CPU platform. ``accelreg env``'s section is :mod:`.env_report`.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from importlib import metadata
from typing import Any

from ... import registry
from ...errors import DeviceError
from ...registry import Plugin
from ...registry.containment import describe
from ...resolution import current_in_use
from .._machinery import table

#: vLLM's entry-point group of out-of-tree platforms.
GROUP = "vllm.platform_plugins"


#: Overrides the declared platform of the current backend: a platform name, a class path, or
#: ``registry`` (accelreg's registry platform).
ENV_PLATFORM = "ACCELREG_VLLM_PLATFORM"


#: The name of accelreg's registry platform (in ``accelreg env`` and :data:`ENV_PLATFORM`).
REGISTRY = "registry"


_NAMES_REGISTRY = "names accelreg's registry platform"


#: What vLLM instantiates for the registry platform (a factory bound to the chosen backend).
_REGISTRY_FACTORY = "accelreg.integrations.vllm.platform.platform"


#: The distributions that ship the ``vllm`` package: the project's own, and its CPU builds.
_DISTRIBUTIONS = table.row("vllm").distributions


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
        device_type: The ``device_type`` of an active plugin's platform class, once it was
            learned (the class imported: only when a backend's declared platforms are not
            installed, or ``accelreg env --vllm-activate``); ``None`` until then, and for a
            platform that declares none.
    """

    name: str
    source: str
    value: str
    state: str
    device_type: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        """Plain data for ``accelreg env --json``."""
        return {
            "name": self.name,
            "source": self.source,
            "value": self.value,
            "state": self.state,
            "device_type": self.device_type,
        }


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


def _overridden() -> bool:
    """Whether :data:`ENV_PLATFORM` names the platform (the user's explicit choice: never
    replaced by a platform plugin chosen by device type)."""
    return bool(os.environ.get(ENV_PLATFORM, "").strip())


def _module_found(qualname: str) -> bool:
    """Whether a class path's top-level package is installed (located, not imported)."""
    try:
        return importlib.util.find_spec(qualname.partition(".")[0]) is not None
    except (ImportError, ValueError):
        return False


def _installed(name: str, known: Mapping[str, PlatformPlugin]) -> bool:
    """Whether a declared platform ``name`` is installed here: the registry platform, a class
    path whose package is installed, one of vLLM's own, or a ``vllm.platform_plugins`` entry
    point (``known``: every platform seen, by name; one left out by ``VLLM_PLUGINS`` counts)."""
    if name == REGISTRY:
        return True
    if "." in name:
        return _module_found(name)
    return name in known


def _join(reason: str | None, text: str) -> str:
    """``reason; text`` (the reason why this backend, when there is one)."""
    return f"{reason}; {text}" if reason else text


@dataclass
class _Asked:
    """What asking vLLM's platforms found in this process.

    Attributes:
        snap: The registry snapshot failures are recorded in.
        builtins: vLLM's built-in probes, by name (asked only when a backend declares one).
        answers: Each out-of-tree plugin that loaded and answered: its class path, or ``None``.
        probed: Each built-in probe asked: its class path, or ``None``.
        failed: Each platform that failed to load, to answer, or (device types learned) to
            import its platform class: the failure in words.
        seen: Every platform, as :class:`PlatformPlugin`, in the order vLLM sees them.
        types: The device types learned (:func:`_device_types`), or ``None`` before.
    """

    snap: Any
    builtins: Mapping[str, Callable[[], str | None]]
    answers: dict[str, str | None]
    failed: dict[str, str]
    seen: dict[str, PlatformPlugin]
    probed: dict[str, str | None] = field(default_factory=dict)
    types: dict[str, str] | None = None


def _ask(snap: Any) -> _Asked:
    """Load and ask every out-of-tree platform plugin, as vLLM does (vLLM's own probes are
    asked later, only when declared). Needs vLLM importable."""
    import vllm.platforms as platforms

    builtins: Mapping[str, Callable[[], str | None]] = dict(platforms.builtin_platform_plugins)
    seen = {name: PlatformPlugin(name, "vLLM", name, "not asked") for name in builtins}
    answers, failed = _plugins(snap, seen)
    return _Asked(snap, builtins, answers, failed, seen)


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
    snap = registry.get()
    asked = _ask(snap)
    target_cpu = _target_cpu(asked)
    if target_cpu is not None:
        made = target_cpu
    else:
        b = current_in_use(snap)
        made = serve(asked, b, _reason(snap, b))
        _check_others(snap, made, asked.failed)
    return Choice(made.backend, made.platform, made.qualname, made.why, tuple(asked.seen.values()))


def _target_cpu(asked: _Asked) -> Choice | None:
    """vLLM's own CPU platform when ``VLLM_TARGET_DEVICE=cpu`` asks for it (else ``None``)."""
    if os.environ.get("VLLM_TARGET_DEVICE", "").strip().lower() != "cpu" or "cpu" not in asked.builtins:
        return None
    try:
        made = _probe(asked, "cpu")
    except _Failed as exc:
        raise DeviceError(f"VLLM_TARGET_DEVICE=cpu, but vLLM's own cpu platform {exc}") from None
    if made is None:
        raise DeviceError("VLLM_TARGET_DEVICE=cpu, but vLLM's own cpu platform says it is not available")
    why = "VLLM_TARGET_DEVICE=cpu asks for vLLM's own CPU platform (an explicit choice accelreg keeps)"
    return Choice("cpu", "cpu", made, why)


def serve(asked: _Asked, b: Any, reason: str | None) -> Choice:
    """The vLLM platform that serves backend ``b`` (``reason``: why ``b`` is the one vLLM
    serves, or ``None`` for a report of every backend). Raises :class:`DeviceError`.

    In order: ``ACCELREG_VLLM_PLATFORM``, else the backend's declared platforms when any of them
    is installed; else (it declares none, or none of them is installed) the one active platform
    plugin whose platform's ``device_type`` is the backend's torch device type; else accelreg's
    registry platform for a backend that declares none, and an error naming what is missing for
    one that declares some."""
    names, who = _declared(b)
    if names == (REGISTRY,):
        return Choice(b.name, REGISTRY, _REGISTRY_FACTORY, _join(reason, f"{who} {_NAMES_REGISTRY}"))
    if names and (_overridden() or any(_installed(n, asked.seen) for n in names)):
        return _declared_choice(asked, b, names, who, reason)
    kind = b.spec.torch_type
    what = (
        f"declares the vLLM platform(s) {', '.join(names)}, none of them installed here"
        if names
        else "declares no vLLM platform of its own"
    )
    types = _device_types(asked)
    matches = sorted(n for n, t in types.items() if t == kind)  # named in the same order everywhere
    if len(matches) > 1:
        listed = " and ".join(f"{n!r} ({asked.seen[n].source}: {asked.answers[n]})" for n in matches)
        raise DeviceError(
            f"the registry chose {b.name}: {who} {what}, and {len(matches)} active vLLM "
            f"platform plugins have its device type {kind!r}: {listed}. accelreg does not pick between them: "
            f"name the one to use with {ENV_PLATFORM}=<name>, or leave the others out with VLLM_PLUGINS"
        )
    if matches:
        name = matches[0]
        p = asked.seen[name]
        why = (
            f"{who} {what}: the platform plugin {name!r} ({p.source}) serves it, the one active vLLM platform "
            f"plugin whose device type is {kind!r}"
        )
        return Choice(b.name, name, asked.answers[name] or "", _join(reason, why))
    unmatched = _unmatched(asked, kind)
    if names:
        return _declared_choice(asked, b, names, who, reason, unmatched=unmatched)
    why = f"{who} {what}: accelreg's registry platform serves it ({unmatched})"
    return Choice(b.name, REGISTRY, _REGISTRY_FACTORY, _join(reason, why))


def _unmatched(asked: _Asked, kind: str) -> str:
    """Why no platform plugin serves device type ``kind``, in words."""
    plugins = sorted((p for p in asked.seen.values() if p.source != "vLLM"), key=lambda p: p.name)
    if not plugins:
        return "no vLLM platform plugin is installed"
    each = []
    for p in plugins:
        if p.device_type is not None:
            each.append(f"{p.name}: {p.device_type}")
        elif p.state.startswith("active: "):
            each.append(f"{p.name}: declares no device type")
        else:
            each.append(f"{p.name}: {p.state.partition(':')[0]}")
    return f"no active vLLM platform plugin has device type {kind!r} ({', '.join(each)})"


def _device_types(asked: _Asked) -> dict[str, str]:
    """The device type of every active out-of-tree plugin's platform, by plugin name: learning
    it imports the class each one answered (once per process). A class that does not import is
    recorded as that plugin's failure (it may be the platform of this very device)."""
    if asked.types is not None:
        return asked.types
    from vllm.utils.import_utils import resolve_obj_by_qualname

    types: dict[str, str] = {}
    for name, answer in asked.answers.items():
        if answer is None or name in asked.failed:
            continue
        p = asked.seen[name]
        try:
            cls = resolve_obj_by_qualname(answer)
        except Exception as exc:  # noqa: BLE001 - recorded as the plugin's failure, not raised here
            what = _fail(asked.snap, name, p.source, "vLLM platform plugin activation", exc)
            asked.failed[name] = text = f"failed: its platform class {answer!r} does not import ({what})"
            asked.seen[name] = replace(p, state=text)
            continue
        kind = getattr(cls, "device_type", None)
        if isinstance(kind, str) and kind:
            types[name] = kind
            asked.seen[name] = replace(p, device_type=kind)
    asked.types = types
    return types


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


def _probe(asked: _Asked, name: str) -> str | None:
    """Ask vLLM's own probe ``name`` (once per :class:`_Asked`); raises :class:`_Failed`."""
    if name in asked.failed:
        raise _Failed(asked.failed[name])
    if name not in asked.probed:
        try:
            asked.probed[name] = _detect(asked.snap, name, asked.builtins[name], "vLLM", asked.seen)
        except _Failed as exc:
            asked.failed[name] = str(exc)
            raise
    return asked.probed[name]


def _declared_choice(
    asked: _Asked,
    b: Any,
    names: tuple[str, ...],
    who: str,
    reason: str | None,
    unmatched: str = "",
) -> Choice:
    """The first active of the platforms ``names`` (declared, or ``ACCELREG_VLLM_PLATFORM``);
    ``unmatched``: why no platform plugin serves the backend's device type, when that was asked."""
    seen = asked.seen
    inactive: list[str] = []
    for name in names:
        if name == REGISTRY:
            return Choice(b.name, REGISTRY, _REGISTRY_FACTORY, _join(reason, f"{who} {_NAMES_REGISTRY}"))
        if "." in name:  # a class path
            _importable(name, name, who)
            return Choice(b.name, name, name, _join(reason, f"{who} declares the vLLM platform class {name}"))
        if name in asked.builtins and asked.seen[name].source == "vLLM":
            source = "vLLM"
            try:
                answer = _probe(asked, name)
            except _Failed as exc:
                raise DeviceError(
                    f"the registry chose {b.name}, whose vLLM platform {name!r} (vLLM's own) {exc}"
                ) from None
        elif name in asked.failed:
            raise DeviceError(
                f"the registry chose {b.name}, whose vLLM platform {name!r} ({seen[name].source}) "
                f"{asked.failed[name]}; declared by {who}"
            )
        elif name in asked.answers:
            answer, source = asked.answers[name], seen[name].source
        elif name in seen and seen[name].state == "left out by VLLM_PLUGINS":
            raise DeviceError(
                f"the registry chose {b.name}, whose vLLM platform {name!r} ({seen[name].source}) is left out by "
                f"VLLM_PLUGINS={os.environ.get('VLLM_PLUGINS')!r}; add it there, or unset VLLM_PLUGINS"
            )
        else:
            installed = [f"{n} ({p.source})" for n, p in seen.items() if p.source != "vLLM"]
            also = f", and {unmatched}" if unmatched else ""
            raise DeviceError(
                f"{who} declares the vLLM platform {name!r}, which is neither one of vLLM's own "
                f"({', '.join(asked.builtins)}) nor an installed platform plugin (entry points {GROUP}: "
                f"{', '.join(installed) or 'none'}){also}; install the plugin, or set {ENV_PLATFORM}={REGISTRY} "
                "to serve it with accelreg's registry platform"
            )
        if answer is None:
            inactive.append(f"{name} ({source}) says it is not active here")
            continue
        _importable(answer, f"the vLLM platform {name!r} ({source})", who)
        where = "vLLM's own" if source == "vLLM" else f"plugin {name!r} of {source}"
        why = f"{who} declares the vLLM platform {name!r} ({where})"
        return Choice(b.name, name, answer, _join(reason, why))
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


# -- what the conformance kit reads ---------------------------------------------------------
def check_declared(backend: str) -> tuple[list[str], list[str]]:
    """``(problems, missing)`` with the vLLM platform ``backend`` declares, against the vLLM
    installed here: what the conformance kit checks. A problem: a plugin that fails to load or
    to answer, a platform class that does not import, or (the backend being available) none of
    the declared platforms active. Missing: a declared name that is neither vLLM's own nor an
    installed plugin here. Both empty when the backend declares none. Needs vLLM importable."""
    snap = registry.get()
    b = snap.backend(backend)
    names, who = tuple(b.spec.vllm_platform or ()), _declarer(b)
    asked = _ask(snap)
    problems: list[str] = []
    missing: list[str] = []
    tried: list[str] = []
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
            if name in asked.builtins and asked.seen[name].source == "vLLM":
                answer = _probe(asked, name)
            elif name in asked.failed:
                problems.append(
                    f"vLLM platform plugin {name!r} ({asked.seen[name].source}) {asked.failed[name]}"
                )
                continue
            elif name in asked.answers:
                answer = asked.answers[name]
            else:
                why = "is left out by VLLM_PLUGINS" if name in asked.seen else "is not installed here"
                missing.append(f"the vLLM platform {name!r} {why} (declared by {who})")
                continue
            tried.append(name)
            if answer is not None:
                _importable(answer, f"the vLLM platform {name!r}", who)
                active = True
        except (_Failed, DeviceError) as exc:
            problems.append(str(exc))
    if tried and not active and not problems and b.available:
        problems.append(
            f"{backend} is available, but none of its vLLM platforms ({', '.join(tried)}) is active here"
        )
    return problems, missing
