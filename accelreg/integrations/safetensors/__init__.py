"""safetensors: every registry device loads, through one seam at the callee.

safetensors' Rust core checks a device string against a list of its own before torch sees it
(0.4.3: cpu, cuda, npu, xpu, mps; 0.4.4: xla; 0.5.0: mlu; 0.5.3: hpu; 0.8.0: musa) and refuses
every other name: ``SafetensorError: device sdaa:0 is invalid``. So peft's adapter loading
(``load_file(..., device=<type>)``), accelerate's ``load_checkpoint_and_dispatch`` and
``load_state``, and anything else that hands a registry device to ``safe_open``,
``load_file`` or ``load_model`` fail on a backend the release does not list.

Seams: ``safetensors.safe_open`` and (0.6+) ``safetensors._safe_open_handle``, the Rust classes
every torch entry point reaches (``load_file`` calls ``safe_open`` from ``safetensors.torch``'s
namespace, ``load_model`` calls ``load_file``: 0.4.3 to 0.8.0), replaced in ``safetensors``,
``safetensors.torch`` and every module that imported them by name. A registry device the
installed release refuses — asked of the release itself (:mod:`.accepts`), never a list of names
here — is resolved by the registry and the file is opened on the cpu, memory-mapped; each tensor
moves to the device as it is read, and its mapped pages are given back (:mod:`.pages`), so the
host holds about one tensor of the file at a time (:mod:`.on_device`). A device the release
takes, an int (safetensors' cuda index) and every other framework go to safetensors untouched.

No served release (nor 0.9.0rc1, the newest on PyPI) has a device-transfer hook of its own
(upstream's drafts: safetensors#779, #786, #804); when one ships, its row gets an adapter that
registers the registry's backends through it instead of patching.
"""

from __future__ import annotations

from .integration import INTEGRATION, disable, enable, enabled

__all__ = ["INTEGRATION", "disable", "enable", "enabled"]
