"""The accelerate row's integration: its seams (the modeling utilities, the state) and the shapes
of the releases each adapter serves. Checkpoints load onto a registry device that safetensors does
not list through the safetensors row's seam, at the callee (``accelreg.integrations.safetensors``)."""

from __future__ import annotations

from .._machinery import table
from .._machinery.seams import LIBRARIES, Adapter, Integration, Seam
from .fsdp import fsdp_plugin_post_init
from .modeling import (
    _MODELING,
    _clear_device_cache,
    _dispatch_model,
    _get_max_memory,
    _set_module_tensor_to_device,
)
from .precision import accelerator_init, get_grad_scaler, is_bf16_available, is_fp16_available
from .state import _default_device, _prepare_backend, _set_device, _wait_for_everyone

__all__ = ["INTEGRATION", "RELEASES", "ROW", "TESTED", "disable", "enable", "enabled"]


_PREPARE_PARAMS = ("self", "cpu", "sagemaker_dp", "backend")

#: Shapes (:func:`~accelreg.integrations._machinery.seams.shape`) of the private or rebuilt seams in the
#: window 1.10.1-1.16.0 (each wraps upstream and falls back to it for what is not the registry's
#: to decide; a new shape is looked at before it is trusted).
_SHAPES: dict[str, tuple[str, ...]] = {
    # 1.10-1.12 (the is_*_available ladder), 1.13, 1.14-1.15, 1.16 (torch.accelerator + a name table)
    "prepare_backend": ("ddc9e63fda615720", "f32aaabbd338151d", "03bc7498537b3f5e", "86cddedf64a26672"),
    # 1.10-1.12, 1.13-1.14, 1.15 (neuron), 1.16 (torch.get_device_module)
    "set_device": ("97c3f8fa52740d20", "28f85c6119baa1da", "5665fe13336acdfc", "0de2d40ec4178e4b"),
    # 1.10-1.12, 1.13, 1.14, 1.15, 1.16 (a ladder of device counts, then torch.accelerator)
    "validate": (
        "6fdff28b414be9fe",
        "f8617b744ece43e1",
        "b6c283536d824d8f",
        "bd8cddd49da1bfb5",
        "2a1ece00f5337397",
    ),
    # Accelerator.__init__: 1.10, 1.11-1.12, 1.13-1.14, 1.15, 1.16 (the fp16 check asks torch)
    "accelerator_init": (
        "1817cb463d440a06",
        "3940d7c6f9e72709",
        "8cbe494ffce85e0e",
        "4bef933b54343b7b",
        "c606d80681ee4373",
    ),
}
_IMPORTS = "accelerate.utils.imports"
#: FullyShardedDataParallelPlugin.__post_init__: 1.10, 1.11, 1.12-1.13, 1.14 (neuron), 1.15 end
#: their ladder in a RuntimeError (patched); 1.16 asks torch.accelerator (nothing to patch)
_FSDP_POST_INIT = (
    "eaf82bc6cb8b1ecb",
    "2764df66cc7a542c",
    "2158d16d88c95587",
    "eec0810db732a51f",
    "db23bafb85df8f83",
)
_FSDP_POST_INIT_116 = ("1fd2aca176a5fb44",)
#: ``PartialState.wait_for_everyone``: 1.10 and 1.16 (a plain barrier for cpu ranks), 1.11-1.12
#: and 1.13-1.15 (``device_ids`` for every multi-process type, the cpu's included).
_WAIT_PLAIN = {"1.10": ("cdad2808dae1e602",), "1.16": ("8e312814a7f3d996",)}
_WAIT_DEVICE_IDS = ("08254cff2b6dc752", "54ce09177b4eec3d")

#: The releases both accelerate integrations serve (the library and its command line), and the
#: ones the release matrix runs.
ROW = table.row("accelerate")
RELEASES = ROW.releases
TESTED = ROW.tested

INTEGRATION = Integration(
    **ROW.declared(),
    seams=[
        Seam(
            _MODELING,
            "get_max_memory",
            _get_max_memory,
            params=("max_memory",),
            importers=("accelerate.utils", "transformers.integrations.accelerate"),
            why="per-device memory of the registry's current backend (no ladder); given keys kept",
        ),
        Seam(
            "accelerate.utils.memory",
            "clear_device_cache",
            _clear_device_cache,
            params=("garbage_collection",),
            importers=("accelerate.hooks", "peft.utils.loftq_utils"),
            why="empty the cache of the current backend",
        ),
        Seam(
            "accelerate.big_modeling",
            "dispatch_model",
            _dispatch_model,
            params=("model", "device_map", "main_device"),
            importers=("accelerate", "accelerate.utils.bnb", "transformers.integrations.accelerate"),
            why="main_device = the map's first accelerator in forward order, not a hash-ordered set's",
        ),
        Seam(
            _MODELING,
            "set_module_tensor_to_device",
            _set_module_tensor_to_device,
            params=("module", "tensor_name", "device", "value", "dtype", "fp16_statistics"),
            importers=("accelerate.hooks", "accelerate.utils", "accelerate.utils.bnb"),
            why="qualified devices; bitsandbytes quantize-on-move on every accelerator its rules allow",
        ),
        Seam(
            "accelerate.state",
            "PartialState.default_device",
            _default_device,
            params=("self",),
            why="the registry's current backend, in accelerate's form",
        ),
        Seam(
            "accelerate.state",
            "PartialState._prepare_backend",
            why="a launched rank of any registry backend gets a multi-process type and dist_backend(); "
            "never a backend the registry would not choose",
            adapters=(
                Adapter(
                    RELEASES, _prepare_backend, shapes=_SHAPES["prepare_backend"], params=_PREPARE_PARAMS
                ),
            ),
        ),
        Seam(
            "accelerate.state",
            "PartialState.set_device",
            why="rank r on <backend>:r (the registry's resolve()); a launched rank silently on the cpu "
            "is a DeviceError",
            adapters=(Adapter(RELEASES, _set_device, shapes=_SHAPES["set_device"], params=("self",)),),
        ),
        Seam(
            "accelerate.accelerator",
            "Accelerator.__init__",
            why="fp16 mixed precision on a registry device that computes in float16 (accelreg.capabilities()), "
            "with autocast and a gradient scaler for its device type; refused where the registry says it does not",
            adapters=(
                Adapter(
                    RELEASES,
                    accelerator_init,
                    shapes=_SHAPES["accelerator_init"],
                    params=("self", "rng_types"),
                ),
            ),
            instead="train in bf16 or fp32 on a device type outside accelerate's list",
        ),
        Seam(
            _IMPORTS,
            "is_bf16_available",
            is_bf16_available,
            params=("ignore_tpu",),
            importers=("accelerate.utils", "accelerate.accelerator"),
            why="bf16 on the registry's accelerator answered by accelreg.capabilities()",
        ),
        Seam(
            _IMPORTS,
            "is_fp16_available",
            is_fp16_available,
            importers=("accelerate.utils",),
            why="fp16 on the registry's accelerator answered by accelreg.capabilities()",
        ),
        Seam(
            _MODELING,
            "get_grad_scaler",
            get_grad_scaler,
            params=("distributed_type", "kwargs"),
            importers=("accelerate.utils", "accelerate.accelerator"),
            why="fp16's gradient scaler for the registry's device type (not cuda's, disabled where there is no CUDA)",
        ),
        Seam(
            "accelerate.utils.dataclasses",
            "FullyShardedDataParallelPlugin.__post_init__",
            why="FSDP's sync_module_states initialises parameters on the registry backend's device type "
            "where accelerate's ladder of device types finds none (it raised 'no available devices')",
            adapters=(
                Adapter(">=1.10,<1.16", fsdp_plugin_post_init, shapes=_FSDP_POST_INIT, params=("self",)),
                Adapter(
                    ">=1.16,<1.17",
                    None,
                    shapes=_FSDP_POST_INIT_116,
                    note="torch.accelerator's device type: nothing to patch",
                ),
            ),
            instead="FullyShardedDataParallelPlugin(sync_module_states=False), or accelerate 1.16",
        ),
        Seam(
            "accelerate.state",
            "PartialState.wait_for_everyone",
            why="a cpu rank's barrier runs on the cpu (1.11-1.15 ran it on the machine's accelerator, "
            "which gloo refuses, when the registry put a launched rank on the cpu)",
            adapters=(
                Adapter(">=1.10,<1.11", None, shapes=_WAIT_PLAIN["1.10"], note="a plain barrier on the cpu"),
                Adapter(">=1.11,<1.16", _wait_for_everyone, shapes=_WAIT_DEVICE_IDS, params=("self",)),
                Adapter(">=1.16,<1.17", None, shapes=_WAIT_PLAIN["1.16"], note="a plain barrier on the cpu"),
            ),
            instead="accelerate 1.16 (or keep the backend enabled)",
        ),
    ],
    scan_prefixes=LIBRARIES,
)

enable, disable, enabled = INTEGRATION.api()
