"""The dtype a model's weights will have once loaded: parse ``torch.float16``, ``"bf16"``, ``"auto"``."""

from __future__ import annotations

from typing import Any

__all__ = ["DTYPE_NAMES", "parse_dtype"]

_ALIASES = {
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "f16": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "f32": "float32",
    "float64": "float64",
    "fp64": "float64",
    "double": "float64",
    "float8_e4m3fn": "float8_e4m3fn",
    "float8_e5m2": "float8_e5m2",
    "fp8": "float8_e4m3fn",
}

#: Every name :func:`parse_dtype` accepts (without ``torch.``), known without importing torch: a
#: command checks ``--dtype`` before it builds anything.
DTYPE_NAMES = (*_ALIASES, "auto")


def parse_dtype(dtype: Any, model: Any = None) -> Any:
    """The floating ``torch.dtype`` meant by ``dtype``, or ``None`` (keep each tensor's own dtype).

    Accepts a floating ``torch.dtype``, a name (``"float16"``, ``"torch.bfloat16"``, ``"bf16"``,
    ``"fp32"``, ...), or ``"auto"``: the dtype recorded in ``model.config`` (``dtype`` or
    ``torch_dtype``), as transformers' ``from_pretrained(dtype="auto")`` uses; ``None`` if the
    config records none.

    Raises:
        ValueError: an unknown name or a non-floating dtype (the message lists accepted names).
    """
    import torch

    if dtype is None:
        return None
    if isinstance(dtype, torch.dtype):
        if not dtype.is_floating_point:
            raise ValueError(
                f"dtype {dtype} is not a floating dtype; weights are loaded as float16, bfloat16, ..."
            )
        return dtype
    if not isinstance(dtype, str):
        raise TypeError(
            f"dtype must be a torch.dtype or a string such as 'float16', got {type(dtype).__name__}"
        )
    name = dtype.strip().lower().removeprefix("torch.")
    if name == "auto":
        config = getattr(model, "config", None)
        recorded = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        return None if recorded is None or recorded == "auto" else parse_dtype(recorded)
    canonical = _ALIASES.get(name)
    if canonical is None or not hasattr(torch, canonical):
        accepted = ", ".join(sorted(_ALIASES)) + ", auto"
        raise ValueError(f"unknown dtype {dtype!r}; accepted: {accepted} (or a torch.dtype)")
    return getattr(torch, canonical)
