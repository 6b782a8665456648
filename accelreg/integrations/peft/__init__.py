"""peft: adapters are staged on the registry's device.

Seam: ``peft.utils.other.infer_device`` (public; imported by name into up to eight more modules;
one shape in peft 0.17-0.21, another in 0.22). It returns ``"cuda"`` first and knows no
musa/sdaa/hpu; 0.22 asks ``torch.accelerator`` last, after its own list, so a process that can
see cuda and a vendor's device still gets cuda whatever the user's priority says. The
replacement returns the registry's current backend in peft's own form — a device *type*
(``"npu"``, ``"cpu"``), which peft's callers compare with ``tensor.device.type`` — and
``load_peft_weights`` / ``PeftModel.load_adapter`` stage adapter tensors there. The indexed
device for this process (``npu:1`` under LOCAL_RANK=1) is :func:`accelreg.resolve`.

Where adapters end up needs no seam: peft already moves each adapter to the device of the
layer it wraps (``BaseTunerLayer._move_adapter_to_device_of_base_layer``); the integration tests
prove it on a model spread over emulated devices.
"""

from __future__ import annotations

from .integration import INTEGRATION, disable, enable, enabled

__all__ = ["INTEGRATION", "disable", "enable", "enabled"]
