"""The dtypes a device may compute in: their names, and a trial a probe can run to find out.

:func:`accelreg.capabilities` answers, per device, whether it computes in each of
:data:`COMPUTE_DTYPES` (and in whatever else its plugin declares). What "computes in" means:

* ``bfloat16``, ``float16``: the device runs a model's operators in that dtype (a matrix
  multiply, a layer norm), natively or emulated the way torch's own answer counts it
  (``torch.cuda.is_bf16_supported()`` counts emulation).
* ``float8_e4m3fn``, ``float8_e5m2``: the device runs a scaled matrix multiply
  (``torch._scaled_mm``) on operands of that format; storing or casting alone does not count.

This module sits at the bottom of the package (it imports nothing of accelreg, and torch only
inside :func:`try_dtypes`).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["COMPUTE_DTYPES", "dtype_name", "try_dtypes"]

#: The dtypes the capability query answers for on every device, as torch names them.
COMPUTE_DTYPES: tuple[str, ...] = ("bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")
#: The spellings of mixed-precision settings (``mixed_precision="bf16"``).
_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16"}
_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")


def dtype_name(dtype: Any) -> str:
    """torch's name of ``dtype``: a ``torch.dtype`` (``torch.bfloat16`` -> ``"bfloat16"``) or a
    name (``"bfloat16"``, ``"torch.bfloat16"``, or ``"bf16"``/``"fp16"``/``"half"``).

    Raises ``TypeError`` for anything else and ``ValueError`` for a string that is no dtype
    name. torch is not imported.
    """
    kind = type(dtype)
    if kind.__module__ == "torch" and kind.__name__ == "dtype":
        text = str(dtype)
    elif isinstance(dtype, str):
        text = str.__str__(dtype).strip().lower()
    else:
        raise TypeError(f"a dtype is a torch.dtype or its name (str), got {kind.__name__}")
    name = text.removeprefix("torch.")
    name = _ALIASES.get(name, name)
    if not _NAME.fullmatch(name):
        raise ValueError(f"{dtype!r} is not a dtype name such as 'bfloat16' or 'float8_e4m3fn'")
    return name


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:160]}" if text else type(exc).__name__


def try_dtypes(device: Any) -> dict[str, tuple[bool, str]]:
    """Run a small computation in each of :data:`COMPUTE_DTYPES` on ``device`` and say which
    ran: ``{"bfloat16": (True, "..."), "float8_e5m2": (False, "RuntimeError: ...")}``.

    A ``dtypes`` probe for a runtime that has no flag to ask (accelreg's cpu backend and the
    emulator use it): a 4x4 matrix multiply and a layer norm in ``bfloat16`` and ``float16``, a
    16x16 ``torch._scaled_mm`` on each float8 format. Tensors of a few hundred bytes, freed at
    once. An exception is a ``False`` with its first line as the reason.
    """
    import torch

    out: dict[str, tuple[bool, str]] = {}
    for name in ("bfloat16", "float16"):
        dtype = getattr(torch, name)
        try:
            x = torch.ones(4, 4, dtype=dtype, device=device)
            y = torch.nn.functional.layer_norm(x @ x, (4,))
            assert y.dtype == dtype and y.shape == (4, 4)
            out[name] = (True, f"a matrix multiply and a layer norm in {name} ran")
        except Exception as exc:  # noqa: BLE001 - the answer is that it did not run
            out[name] = (False, f"a matrix multiply and a layer norm in {name} failed: {_first_line(exc)}")
    for name in ("float8_e4m3fn", "float8_e5m2"):
        out[name] = _try_scaled_mm(torch, device, name)
    return out


def _try_scaled_mm(torch: Any, device: Any, name: str) -> tuple[bool, str]:
    """A 16x16 ``torch._scaled_mm`` with ``name`` operands (the second column-major, float32
    scalar scales, as every backend's kernel takes them). float8_e5m2 holds gradients and is
    multiplied with float8_e4m3fn too (cuBLAS refuses two e5m2 operands): either pairing counts."""
    scaled_mm = getattr(torch, "_scaled_mm", None)
    dtype = getattr(torch, name, None)
    if dtype is None or scaled_mm is None:
        what = f"torch.{name}" if dtype is None else "torch._scaled_mm"
        return False, f"torch {torch.__version__} has no {what}"
    pairs = [(dtype, dtype)]
    if name == "float8_e5m2" and hasattr(torch, "float8_e4m3fn"):
        pairs.append((torch.float8_e4m3fn, dtype))
    failure = ""
    for first, second in pairs:
        try:
            a = torch.ones(16, 16, device=device).to(first)
            b = torch.ones(16, 16, device=device).to(second).t()
            one = torch.ones((), device=device)
            y = scaled_mm(a, b, one, one, out_dtype=torch.bfloat16)
            assert y.shape == (16, 16)
            return True, f"a scaled matrix multiply (torch._scaled_mm) on {name} ran"
        except Exception as exc:  # noqa: BLE001 - the answer is that it did not run
            failure = failure or _first_line(exc)
    return False, f"a scaled matrix multiply on {name} failed: {failure}"
