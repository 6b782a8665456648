"""What the vendor stand-in packages (``accelreg_emu/shims/<name>/...``) share.

A stand-in is importable only in a process whose ``ACCELREG_EMU_NAME`` names its vendor
(``accelreg_emu_pth`` puts its directory on ``sys.path``); importing it activates the
emulator, as importing the real package brings up the real runtime.
"""

from __future__ import annotations

import os
from typing import Any

import torch

__all__ = ["bootstrap", "npu_fusion_attention", "npu_rotary_mul", "shim_version", "typed_tensor"]


def bootstrap(name: str, package: str) -> None:
    """Activate the emulator as ``name`` for the stand-in ``package``; ImportError otherwise."""
    wanted = os.environ.get("ACCELREG_EMU_NAME", "").strip().lower()
    if wanted != name:
        raise ImportError(
            f"{package} here is accelreg-emu's stand-in for the {name} runtime and only loads "
            f"with ACCELREG_EMU_NAME={name} (it is {wanted or 'unset'})"
        )
    import accelreg_emu

    accelreg_emu.activate()


def shim_version() -> str:
    """Version the stand-ins report: torch's, marked as emulated."""
    return f"{torch.__version__.split('+')[0]}+accelreg.emu"


class _TypedTensorMeta(type):
    _dtype: torch.dtype
    _device_type: str

    def __instancecheck__(cls, obj: object) -> bool:
        return (
            isinstance(obj, torch.Tensor) and obj.device.type == cls._device_type and obj.dtype == cls._dtype
        )


def typed_tensor(device_type: str, dtype: torch.dtype, name: str) -> type:
    """A legacy ``torch.<dev>.FloatTensor``-style constructor (and isinstance check)."""

    def __new__(cls: type, *args: Any) -> torch.Tensor:
        if len(args) == 1 and not isinstance(args[0], int):
            data = torch.as_tensor(args[0], dtype=dtype)
        else:
            data = torch.empty(*args, dtype=dtype)
        return data.to(device_type)

    return _TypedTensorMeta(name, (), {"__new__": __new__, "_dtype": dtype, "_device_type": device_type})


# ---------------------------------------------------------------- torch_npu operators


def _causal(q_len: int, k_len: int, device: torch.device, bottom_right: bool) -> torch.Tensor:
    """True where attention is masked out."""
    shift = k_len - q_len if bottom_right else 0
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).triu(diagonal=1 + shift)


def npu_fusion_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    head_num: int,
    input_layout: str,
    pse: torch.Tensor | None = None,
    padding_mask: torch.Tensor | None = None,
    atten_mask: torch.Tensor | None = None,
    scale: float = 1.0,
    keep_prob: float = 1.0,
    pre_tockens: int = 2147483647,
    next_tockens: int = 2147483647,
    inner_precise: int = 0,
    prefix: Any = None,
    actual_seq_qlen: Any = None,
    actual_seq_kvlen: Any = None,
    sparse_mode: int = 0,
    **_: Any,
) -> tuple[torch.Tensor, ...]:
    """Reference ``torch_npu.npu_fusion_attention`` for layouts BSND, BNSD, BSH and SBH.

    ``atten_mask`` is True where attention is masked out; with ``sparse_mode`` 2 (top-left)
    or 3 (bottom-right) it is the compressed 2048x2048 causal mask and the causal mask of the
    real sizes is used. Returns a 7-tuple whose first item is the attention output in the
    input layout (the rest are placeholders, as frameworks read only ``[0]``).
    """
    layout = input_layout.upper()
    if layout == "TND":
        raise NotImplementedError("accelreg-emu: npu_fusion_attention does not emulate TND (varlen)")
    if layout == "BSND":
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    elif layout == "BNSD":
        q, k, v = query, key, value
    elif layout in ("BSH", "SBH"):

        def split(t: torch.Tensor) -> torch.Tensor:
            t = t if layout == "BSH" else t.transpose(0, 1)
            b, s, h = t.shape
            return t.reshape(b, s, head_num, h // head_num).transpose(1, 2)

        q, k, v = split(query), split(key), split(value)
    else:
        raise ValueError(f"npu_fusion_attention: unknown input_layout {input_layout!r}")
    # Grouped-query attention: repeat key/value heads.
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if pse is not None:
        scores = scores + pse
    if atten_mask is not None:
        if sparse_mode in (2, 3):
            mask = _causal(q.shape[-2], k.shape[-2], q.device, bottom_right=sparse_mode == 3)
        else:
            mask = atten_mask.to(torch.bool)
        scores = scores.masked_fill(mask, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    if keep_prob < 1.0:
        probs = torch.nn.functional.dropout(probs, p=1.0 - keep_prob)
    out = torch.matmul(probs, v)
    if layout == "BSND":
        out = out.transpose(1, 2)
    elif layout in ("BSH", "SBH"):
        b, n, s, d = out.shape
        out = out.transpose(1, 2).reshape(b, s, n * d)
        if layout == "SBH":
            out = out.transpose(0, 1)
    empty = torch.empty(0, device=query.device)
    return out.contiguous(), empty, empty, empty, 0, 0, 0


def npu_rotary_mul(
    x: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, rotary_mode: str = "half"
) -> torch.Tensor:
    """Reference ``torch_npu.npu_rotary_mul``: ``x * cos + rotate(x) * sin``."""
    if rotary_mode == "half":
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    elif rotary_mode == "interleave":
        pairs = x.reshape(*x.shape[:-1], -1, 2)
        rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).reshape(x.shape)
    else:
        raise ValueError(f"npu_rotary_mul: unknown rotary_mode {rotary_mode!r}")
    return x * r1 + rotated * r2
