"""transformers' bf16 and fp16 checks, answered by the registry's capability query.

``is_torch_bf16_gpu_available()`` (what ``TrainingArguments(bf16=True)`` asks) is a ladder of
device types (supa, cuda, xpu, hpu, npu, mps, musa, mlu, neuron, tpu) ending in ``False``, so a
backend outside it is refused bf16 although its runtime computes in it;
``is_torch_fp16_available_on_device(device)`` and ``is_torch_bf16_available_on_device(device)``
try a computation (or answer by name for hpu and cuda). Each replacement answers
:func:`accelreg.capabilities` for the registry's accelerator (the current backend's device, or
the device named), and keeps transformers' own answer where the registry has none: no
accelerator (these are questions about the accelerator, not the cpu backend), a device type no
registry backend has, or an answer nobody knows.
"""

from __future__ import annotations

import functools
from typing import Any

from .._machinery.precision import accelerator_supports

__all__ = ["bf16_gpu_available", "on_device"]


def bf16_gpu_available(original: Any) -> Any:
    """The replacement of ``transformers.utils.import_utils.is_torch_bf16_gpu_available``."""

    @functools.wraps(original)
    def is_torch_bf16_gpu_available() -> bool:
        import torch

        answer = accelerator_supports(torch.bfloat16)
        return original() if answer is None else answer

    return is_torch_bf16_gpu_available


def on_device(dtype_name: str) -> Any:
    """The replacement factory of ``is_torch_<fp16|bf16>_available_on_device(device)`` for
    ``dtype_name`` (``"float16"``, ``"bfloat16"``)."""

    def make(original: Any) -> Any:
        @functools.wraps(original)
        def available_on_device(device: Any) -> bool:
            answer = accelerator_supports(dtype_name, device)
            return original(device) if answer is None else answer

        return available_on_device

    return make
