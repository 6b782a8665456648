"""``torch_npu.optim`` stand-in: the fused optimizers are torch's own."""

from __future__ import annotations

import torch


class NpuFusedAdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` under torch_npu's fused-optimizer name."""


class NpuFusedAdam(torch.optim.Adam):
    """``torch.optim.Adam`` under torch_npu's fused-optimizer name."""


class NpuFusedSGD(torch.optim.SGD):
    """``torch.optim.SGD`` under torch_npu's fused-optimizer name."""


__all__ = ["NpuFusedAdam", "NpuFusedAdamW", "NpuFusedSGD"]
