"""How bitsandbytes' quantized layers load: the ``before_load``/``after_load`` adapters of the
built-in bitsandbytes placement rules (bitsandbytes 0.50).

accelreg's load hook has already moved the travelling keys to the device of the module's live
quantized weight (resolved through the registry; never a hard-coded "cuda"). What remains is
bitsandbytes-specific:

8-bit (``Linear8bitLt``)
    * ``weight_format`` must be 0 ("row"); older GPU-tiled layouts are refused with a clear
      error. It is always dropped: bitsandbytes only pops it when the weight key is present.
    * After any forward pass bitsandbytes keeps the row scales in ``module.state.SCB`` and sets
      ``weight.SCB = None``, but its loader only looks at ``weight.SCB`` ("Loading a quantized
      checkpoint into non-quantized Linear8bitLt is not supported"). The adapter points
      ``weight.SCB`` at ``state.SCB`` for the load so bitsandbytes copies in place, and puts the
      module's layout back afterwards.
    * ``state.CB`` (the int8 matrix forward computes with) is re-aliased to the loaded weight;
      under ZeRO-3, where the weight is a partition placeholder during the load, the re-sync
      happens at the next forward, after DeepSpeed has gathered the weight.
4-bit (``Linear4bit``)
    * bitsandbytes has no loader for the quantization state: strict loads fail on
      ``weight.absmax`` and non-strict loads silently keep a stale state. The adapter consumes
      every ``weight.*`` component, rebuilds the state with ``QuantState.from_dict`` on the live
      device and copies it into the live state in place (every alias sees it).
    * A live weight repacked for the CPU bf16 kernel is converted back first.
"""

from __future__ import annotations

from typing import Any

from ..errors import PlacementError

_ROW = 0


def _format_name(value: Any) -> str:
    from bitsandbytes.utils import INVERSE_LINEAR_8BIT_WEIGHTS_FORMAT_MAPPING as names

    if hasattr(value, "item"):
        value = value.item()
    return names.get(value, f"unknown format id {value}") if isinstance(value, int) else str(value)


def before_load_8bit(module: Any, state_dict: dict[str, Any], prefix: str, device: Any, event: dict[str, Any]) -> None:
    import torch

    fmt_key, scb_key, weight_key = prefix + "weight_format", prefix + "SCB", prefix + "weight"
    if fmt_key in state_dict:
        name = _format_name(state_dict[fmt_key])
        if name != "row":
            raise PlacementError(
                f"{prefix[:-1]}: the checkpoint's int8 weight is in the legacy {name!r} layout "
                f"(weight_format={state_dict[fmt_key]!r}); bitsandbytes 0.45+ loads only the row-major "
                "layout: re-save the checkpoint with a current bitsandbytes"
            )
        del state_dict[fmt_key]
    live = module.weight
    if live.dtype != torch.int8 or module.state.has_fp16_weights:
        raise PlacementError(
            f"{prefix[:-1]}: the checkpoint holds int8-quantized state but the live layer is not quantized "
            f"(weight dtype {live.dtype}); load the model quantized (BitsAndBytesConfig(load_in_8bit=True))"
        )
    if weight_key in state_dict and state_dict[weight_key].dtype != torch.int8:
        raise PlacementError(
            f"{weight_key}: the checkpoint weight is {state_dict[weight_key].dtype} but the live layer is "
            "int8-quantized; load a float checkpoint before quantizing"
        )
    if scb_key in state_dict and getattr(live, "SCB", None) is None:
        if module.state.SCB is None:
            raise PlacementError(f"{prefix[:-1]}: the live layer has no row scales (SCB); it was never quantized")
        live.SCB = module.state.SCB  # bitsandbytes copies the checkpoint's SCB into this, in place
        event["scb_aliased"] = True


def after_load_8bit(module: Any, event: dict[str, Any]) -> None:
    weight, state = module.weight, module.state
    if event.pop("scb_aliased", False):
        state.SCB = weight.SCB
        weight.SCB = None  # the module's post-forward layout
    if state.CB is None:
        return
    if hasattr(weight, "ds_shape"):  # ZeRO-3: weight.data is a placeholder until gathered
        _resync_at_next_forward(module)
        event["note_cb"] = "int8 copy re-synced at the next forward (ZeRO-3 partitioned weight)"
    elif state.CB.data_ptr() != weight.data.data_ptr() and state.CB.shape == weight.data.shape:
        state.CB = weight.data


def _resync_at_next_forward(module: Any) -> None:
    if module.__dict__.get("_accelreg_cb_resync") is not None:
        return

    def resync(mod: Any, args: Any) -> None:
        import torch

        weight = mod.weight
        if tuple(weight.data.shape) != tuple(weight.ds_shape):
            return  # not gathered yet; try again at the next call
        if mod.state.CB is not None and not torch.equal(mod.state.CB, weight.data):
            mod.state.CB = weight.data.clone()  # bitsandbytes' private full copy under ZeRO-3
        handle = mod.__dict__.pop("_accelreg_cb_resync", None)
        if handle is not None:
            handle.remove()

    # Registered now, i.e. after DeepSpeed's gather pre-hook: it runs once the weight is whole.
    module.__dict__["_accelreg_cb_resync"] = module.register_forward_pre_hook(resync)


def before_load_4bit(module: Any, state_dict: dict[str, Any], prefix: str, device: Any, event: dict[str, Any]) -> None:
    from bitsandbytes.functional import QuantState

    weight_key = prefix + "weight"
    parts = {k[len(weight_key) + 1 :]: state_dict.pop(k) for k in [k for k in state_dict if k.startswith(weight_key + ".")]}
    live = module.weight
    state = getattr(live, "quant_state", None) or getattr(module, "quant_state", None)
    if state is None or not getattr(live, "bnb_quantized", False):
        raise PlacementError(
            f"{prefix[:-1]}: the checkpoint holds 4-bit quantized state but the live layer is not quantized; "
            "load the model quantized (BitsAndBytesConfig(load_in_4bit=True))"
        )
    if getattr(state, "packing_format_for_cpu", False):
        from bitsandbytes.functional import _convert_weight_packed_for_cpu_inverse

        live.data, state = _convert_weight_packed_for_cpu_inverse(live.data, state)
        live.quant_state = module.quant_state = state
        event["unpacked_cpu_format"] = True
    if weight_key in state_dict:
        saved = state_dict[weight_key]
        if saved.dtype != live.dtype or tuple(saved.shape) != tuple(live.shape):
            raise PlacementError(
                f"{weight_key}: the checkpoint's {tuple(saved.shape)} {saved.dtype} does not match the live packed "
                f"4-bit weight {tuple(live.shape)} {live.dtype}"
            )
    if not parts:
        return
    try:
        loaded = QuantState.from_dict(dict(parts), device=device)
    except (ValueError, AssertionError, KeyError) as exc:
        raise PlacementError(
            f"{prefix[:-1]}: unsupported 4-bit quantization state in the checkpoint "
            f"(components {sorted(parts)}): {exc}"
        ) from exc
    if loaded.quant_type != state.quant_type or tuple(loaded.shape) != tuple(state.shape):
        raise PlacementError(
            f"{prefix[:-1]}: the checkpoint's quantization state is {loaded.quant_type} {tuple(loaded.shape)}, "
            f"the live layer's {state.quant_type} {tuple(state.shape)}"
        )
    _assign(state, loaded)
    live.quant_state = module.quant_state = state
    event["quant_state_restored"] = sorted(parts)


def _copy_into(obj: Any, name: str, value: Any) -> None:
    current = getattr(obj, name, None)
    if (
        hasattr(current, "copy_")
        and hasattr(value, "shape")
        and current.shape == value.shape
        and current.dtype == value.dtype
        and current.device == value.device
    ):
        current.copy_(value)  # in place: every alias of the live tensor sees the checkpoint
    else:
        setattr(obj, name, value)


def _assign(dst: Any, src: Any) -> None:
    import torch

    with torch.no_grad():
        _copy_into(dst, "absmax", src.absmax)
        _copy_into(dst, "code", src.code)
        dst.shape, dst.dtype, dst.blocksize, dst.quant_type = src.shape, src.dtype, src.blocksize, src.quant_type
        if src.state2 is None:
            dst.state2, dst.offset = None, None
        else:
            if dst.state2 is None:
                dst.state2 = src.state2
            else:
                _copy_into(dst.state2, "absmax", src.state2.absmax)
                _copy_into(dst.state2, "code", src.state2.code)
                dst.state2.blocksize, dst.state2.dtype = src.state2.blocksize, src.state2.dtype
            _copy_into(dst, "offset", src.offset)
        dst.nested = src.state2 is not None
