"""The safetensors row's integration: its seams, the release's two openers (``safe_open``;
``_safe_open_handle`` since 0.6), held by ``safetensors``, ``safetensors.torch`` and every module
that imported them by name."""

from __future__ import annotations

from typing import Any

from .._machinery import table
from .._machinery.seams import LIBRARIES, Adapter, Integration, Seam
from .opening import open_by_handle, open_by_path

__all__ = ["INTEGRATION", "RELEASES", "ROW", "disable", "enable", "enabled"]

ROW = table.row("safetensors")
RELEASES = ROW.releases

#: What the seams' adapters check at enable time: the original is the release's handle class
#: (a Rust class, so no source and no signature to match): it opens with a context manager and
#: hands out tensors and slices by name.
_HANDLE_METHODS = ("__enter__", "__exit__", "get_tensor", "get_slice", "keys", "metadata")


def _is_handle_class(original: Any) -> bool:
    return isinstance(original, type) and all(hasattr(original, m) for m in _HANDLE_METHODS)


_WHY = (
    "a registry device this release cannot take ({}) is opened on the cpu (memory-mapped) and each "
    "tensor moved to it as it is read; a device the release takes goes to it untouched"
)

INTEGRATION = Integration(
    **ROW.declared(),
    seams=[
        Seam(
            "safetensors",
            "safe_open",
            why=_WHY.format("safe_open, load_file, load_model"),
            adapters=(Adapter(RELEASES, open_by_path, probe=_is_handle_class),),
            instead="open the file with device='cpu' and move each tensor with tensor.to(device)",
        ),
        Seam(
            "safetensors",
            "_safe_open_handle",
            why=_WHY.format("an open file object"),
            adapters=(
                Adapter(">=0.6,<0.9", open_by_handle, probe=_is_handle_class),
                Adapter(">=0.4.3,<0.6", None, absent=True, note="no such opener"),
            ),
            instead="open the file with device='cpu' and move each tensor with tensor.to(device)",
        ),
    ],
    scan_prefixes=("safetensors", *LIBRARIES),
)

enable, disable, enabled = INTEGRATION.api()
