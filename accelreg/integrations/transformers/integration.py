"""The transformers row's integration: its seams (device maps at load, quantizers, hub kernels)
and the shapes of the releases each adapter serves."""

from __future__ import annotations

from .._machinery import table
from .._machinery.seams import LIBRARIES, Adapter, Integration, Seam
from .device_map import (
    _MU,
    _TIA,
    _check_and_set_device_map,
    _expand_device_map,
    _from_pretrained,
    _get_device_map,
    normalize_device_map,
)
from .kernels import _HK, _kernelize, hub_kernels_support
from .quantizers import _postprocess_model, _update_device_map

__all__ = [
    "INTEGRATION",
    "disable",
    "enable",
    "enabled",
    "hub_kernels_support",
    "normalize_device_map",
]


#: Shapes (:func:`~accelreg.integrations._machinery.seams.shape`) of the private functions, per release
#: family, read from every release in the window (docs/compatibility.md lists them).
_CHECK_5 = ("35e14fb17d5bcc80",)  # 5.0-5.25
_GET_5 = (
    "a89d9d3600a50ab0",  # 5.0
    "ef4a0fdf552b5108",  # 5.1-5.3
    "095d5534432bf2f5",  # 5.4-5.15 (the reserved-memory loop moved into get_max_memory)
    "cca7d7e6d5492798",  # 5.16-5.25 (_no_placement_params)
)
_GET_457 = ("e9bc406151511616",)  # 4.57.x: modeling_utils, with dtype and keep_in_fp32_regex
_EXPAND_5 = ("a36395b8a9c8deb5",)  # 5.0-5.25: one unanchored regex of the keys
_EXPAND_457 = ("ce57bc8aa6fb2737",)  # 4.57.x: exact dotted prefixes (nothing to fix)
_BNB8 = ("73df0f3df692e403", "0273761cb2b0d6c2", "0292ddef364a88a2")  # 4.57 / 5.0-5.3 / 5.4+
_BNB4 = ("0273761cb2b0d6c2", "0292ddef364a88a2")  # 4.57-5.3 / 5.4+
_GET_PARAMS = ("model", "device_map", "max_memory", "hf_quantizer")
_KERNELIZE_DEFAULT = ("88a2f4cb507e77bb",)  # 5.25: from_pretrained kernelizes unless told not to
_KERNELIZE_ON_REQUEST = (
    "224b780e922dca67",  # 5.13-5.14
    "4c5b39b1181aa626",  # 5.15-5.16
    "0a8cd555efc5c538",  # 5.17
    "ee5d16ffe5a160bf",  # 5.18
    "b5c5c32882de9f2a",  # 5.19
    "5d37e3b6dde5c4b9",  # 5.20-5.22
    "5d744bb7f1c9f19b",  # 5.23-5.24
)

#: The releases the integration serves, and the two lines of them whose seams differ.
ROW = table.row("transformers")
RELEASES = ROW.releases
_V4, _V5 = "~=4.57.0", ">=5.0,<5.26"

INTEGRATION = Integration(
    **ROW.declared(),
    seams=[
        Seam(
            _TIA,
            "check_and_set_device_map",
            importers=(_MU,),
            why="resolve ints, backend names and devices in device_map through the registry",
            adapters=(
                Adapter(_V5, _check_and_set_device_map, shapes=_CHECK_5, params=("device_map",)),
                Adapter(
                    _V4,
                    None,
                    shapes=_GET_457,
                    module=_MU,
                    target="_get_device_map",
                    note="inline in from_pretrained; _get_device_map qualifies",
                ),
            ),
        ),
        Seam(
            _TIA,
            "_get_device_map",
            importers=(_MU,),
            why="plan strategies with accelreg.plan_device_map; validate user maps",
            adapters=(
                Adapter(_V5, _get_device_map, shapes=_GET_5, params=_GET_PARAMS),
                Adapter(
                    _V4,
                    _get_device_map,
                    shapes=_GET_457,
                    params=(*_GET_PARAMS, "dtype", "keep_in_fp32_regex"),
                    module=_MU,
                ),
            ),
        ),
        Seam(
            _TIA,
            "expand_device_map",
            importers=(_MU,),
            why="longest-dotted-prefix matching; no silent fallback",
            adapters=(
                Adapter(_V5, _expand_device_map, shapes=_EXPAND_5, params=("device_map", "param_names")),
                Adapter(_V4, None, shapes=_EXPAND_457, module=_MU, note="exact prefixes already"),
            ),
        ),
        Seam(
            "transformers.quantizers.quantizer_bnb_8bit",
            "Bnb8BitHfQuantizer.update_device_map",
            why="default device of an 8-bit load from the registry",
            adapters=(Adapter(RELEASES, _update_device_map, shapes=_BNB8, params=("self", "device_map")),),
        ),
        Seam(
            "transformers.quantizers.quantizer_bnb_4bit",
            "Bnb4BitHfQuantizer.update_device_map",
            why="default device of a 4-bit load from the registry",
            adapters=(Adapter(RELEASES, _update_device_map, shapes=_BNB4, params=("self", "device_map")),),
        ),
        Seam(
            "transformers.quantizers.base",
            "HfQuantizer.postprocess_model",
            _postprocess_model,
            params=("self", "model"),
            why="attach the quantized-weight placement rules after loading",
        ),
        Seam(
            _HK,
            "kernelize",
            importers=(_MU,),
            why="hub kernels by default: int device-map values resolved, and a device type the kernels "
            "library does not run on keeps the model's torch layers instead of failing the load",
            adapters=(
                Adapter(
                    ">=5.25,<5.26",
                    _kernelize,
                    shapes=_KERNELIZE_DEFAULT,
                    params=("model", "mode", "kernel_config", "device_map"),
                    note="by default",
                ),
                Adapter(
                    ">=5.13,<5.25",
                    None,
                    shapes=_KERNELIZE_ON_REQUEST,
                    params=("model", "mode"),
                    note="on request only",
                ),
                Adapter("~=4.57.0 | >=5.0,<5.13", None, absent=True),
            ),
            instead="pass from_pretrained(..., use_kernels=False) or set USE_HUB_KERNELS=0 where the kernels "
            "library does not run on your backend (accelreg.integrations.transformers.hub_kernels_support)",
        ),
        Seam(
            _MU,
            "PreTrainedModel.from_pretrained",
            _from_pretrained,
            params=("cls", "pretrained_model_name_or_path"),
            why="offload_folder counts as a disk budget; hf_device_map keeps transformers' value forms",
        ),
    ],
    scan_prefixes=LIBRARIES,
)


enable, disable, enabled = INTEGRATION.api()
