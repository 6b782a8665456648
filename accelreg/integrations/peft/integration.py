"""The peft row's integration: its one seam, ``peft.utils.other.infer_device`` (public; imported
by name into up to eight more modules; one shape in peft 0.17-0.21, another in 0.22, which asks
``torch.accelerator`` after its own list and so still answers cuda, mps, mlu, xpu or npu first)."""

from __future__ import annotations

from .._machinery import table
from .._machinery.seams import Adapter, Integration, Seam
from .device import infer_device

__all__ = ["INTEGRATION", "ROW", "disable", "enable", "enabled"]

ROW = table.row("peft")

INTEGRATION = Integration(
    **ROW.declared(),
    seams=[
        Seam(
            "peft.utils.other",
            "infer_device",
            infer_device,
            importers=(
                "peft.utils",
                "peft.utils.save_and_load",
                "peft.peft_model",
                "peft.utils.hotswap",
                "peft.optimizers.lorafa",
                "peft.tuners.lora.monteclora",
                # peft 0.22
                "peft.tuners.lora.variants",
                "peft.utils.loftq_utils",
            ),
            why="stage adapter weights on the registry's backend (not cuda-first)",
            adapters=(
                Adapter(">=0.17,<0.22", infer_device, shapes=("1a138aaf7722ef16",)),
                # 0.22 asks torch.accelerator after its own list: the same replacement serves it
                Adapter(">=0.22,<0.23", infer_device, shapes=("7b4bc723810e674b",)),
            ),
        )
    ],
    scan_prefixes=("peft", "transformers"),
)


enable, disable, enabled = INTEGRATION.api()
