"""What a backend's devices compute in: the plugin's declaration or probe, else the runtime's
own answer, else "unknown" with the reason (never a silent ``False``).

For each device, in order, for each dtype:

1. the plugin's ``BackendSpec.dtypes``: a mapping declared once (checked at registration), or a
   probe ``(index) -> mapping``, called at most once per device per snapshot, contained like
   every probe: one that raises or answers nonsense is recorded and leaves that device's
   answers unknown, "because ...";
2. for bfloat16 and float16 the plugin left undecided, the runtime's device module:
   ``torch.<device_type>.is_bf16_supported()`` (bfloat16), then
   ``torch.<device_type>.get_amp_supported_dtype()`` (a dtype it lists is computed); asked once
   per snapshot, contained the same way;
3. otherwise unknown, saying who was asked.

Nothing runs for a backend that is unavailable except a declared mapping (data).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from ..dtypes import COMPUTE_DTYPES, dtype_name
from ..types import Capabilities, DtypeSupport
from .containment import Nonsense, safe_repr
from .probing import Backend, ProbeFailed
from .records import Checked, check_dtypes

__all__ = ["capabilities", "runtime_answers"]

#: The runtime questions asked for a dtype the plugin left undecided.
_RUNTIME_ASKS = {
    "bfloat16": ("is_bf16_supported", "get_amp_supported_dtype"),
    "float16": ("get_amp_supported_dtype",),
}


def _check_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise Nonsense(f"answered {safe_repr(value)}, not True or False")
    return bool(value)


def _check_dtype_list(value: Any) -> tuple[str, ...]:
    try:
        return tuple(dtype_name(d) for d in value)
    except (TypeError, ValueError) as exc:
        raise Nonsense(f"answered {safe_repr(value)}, not a list of torch dtypes: {exc}") from None


def _who(b: Backend) -> str:
    """``"npu's plugin (accelreg)"``."""
    dist = b.plugin.distribution
    who = dist if dist and not dist.startswith("<") else b.plugin.name  # register()ed: its name
    return f"{b.name}'s plugin ({who})" if who else f"{b.name}'s plugin"


def runtime_answers(b: Backend) -> dict[str, tuple[bool | None, str]]:
    """What ``torch.<device_type>`` says about bfloat16 and float16 (only what it says), asked
    once per snapshot."""
    return b.memo("runtime dtypes", lambda: _runtime_answers(b))


def _runtime_answers(b: Backend) -> dict[str, tuple[bool | None, str]]:
    torch = sys.modules.get("torch")
    module = getattr(torch, b.device_type, None) if torch is not None else None
    if module is None:
        return {}
    mod = f"torch.{b.device_type}"
    out: dict[str, tuple[bool | None, str]] = {}
    fn = getattr(module, "is_bf16_supported", None)
    if callable(fn):
        try:
            value = b.call(f"{mod}.is_bf16_supported", fn, check=_check_bool)
            out["bfloat16"] = (value, f"{mod}.is_bf16_supported() answered {value}")
        except ProbeFailed as failed:
            out["bfloat16"] = (
                None,
                f"unknown, because {mod}.is_bf16_supported() failed: {failed.failure.error}",
            )
    fn = getattr(module, "get_amp_supported_dtype", None)
    if callable(fn):
        try:
            listed = b.call(f"{mod}.get_amp_supported_dtype", fn, check=_check_dtype_list)
        except ProbeFailed as failed:
            listed = ()
            for name in ("bfloat16", "float16"):
                out.setdefault(
                    name,
                    (
                        None,
                        f"unknown, because {mod}.get_amp_supported_dtype() failed: {failed.failure.error}",
                    ),
                )
        for name in ("bfloat16", "float16"):
            if name in listed and out.get(name, (None,))[0] is None:
                out[name] = (True, f"{mod}.get_amp_supported_dtype() lists torch.{name}")
    return out


def capabilities(b: Backend, index: int, device: str) -> Capabilities:
    """What device ``index`` of ``b`` computes in (``device`` is its string), computed once per
    snapshot."""
    return b.memo(("capabilities", index), lambda: _answer(b, index, device))


def _answer(b: Backend, index: int, device: str) -> Capabilities:
    declared = b.spec.dtypes
    mine: Checked = {}
    source, failed = "declared", None
    if isinstance(declared, Mapping):
        mine = dict(declared)  # checked by own_spec at registration
    elif declared is not None and b.available:
        source = "probe"
        try:
            mine = b.call("dtypes", declared, index, check=check_dtypes)
        except ProbeFailed as exc:
            failed = f"the dtypes probe of {_who(b)} {'answered nonsense' if exc.nonsense else 'failed'}: {exc.failure.error}"
    undecided = any(mine.get(name, (None,))[0] is None for name in _RUNTIME_ASKS)
    runtime = runtime_answers(b) if b.available and failed is None and undecided else {}
    out = []
    for name in (*COMPUTE_DTYPES, *(n for n in mine if n not in COMPUTE_DTYPES)):
        value, reason = mine.get(name, (None, None))
        if value is not None:
            default = "declared by" if source == "declared" else "answered by the dtypes probe of"
            out.append(DtypeSupport(name, value, source, reason or f"{default} {_who(b)}"))
        elif failed is not None:
            out.append(DtypeSupport(name, None, "unknown", f"unknown, because {failed}"))
        elif name in runtime and runtime[name][0] is not None:
            out.append(DtypeSupport(name, runtime[name][0], "runtime", runtime[name][1]))
        else:
            out.append(DtypeSupport(name, None, "unknown", _unknown(b, name, reason, runtime.get(name))))
    return Capabilities(backend=b.name, device=device, dtypes=tuple(out))


def _unknown(b: Backend, name: str, reason: str | None, runtime: tuple[bool | None, str] | None) -> str:
    """Why nobody answered for ``name``."""
    if not b.available:
        return f"unknown, because {b.name} is unavailable: {b.probe().availability.reason}"
    said = (
        f"{_who(b)} does not say ({reason})"
        if reason
        else f"{_who(b)} declares nothing about {name} (BackendSpec.dtypes)"
    )
    if runtime is not None:
        return f"unknown: {said}, and {runtime[1]}"
    asks = _RUNTIME_ASKS.get(name)
    if asks is None:
        return f"unknown: {said}, and torch asks runtimes nothing about {name}"
    return f"unknown: {said}, and torch.{b.device_type} has no {' or '.join(f'{a}()' for a in asks)}"
