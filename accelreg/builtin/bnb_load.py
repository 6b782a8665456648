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

from ..plugin import PlacementError

_ROW = 0


def _format_value(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def _format_name(value: Any) -> str:
    from bitsandbytes.utils import INVERSE_LINEAR_8BIT_WEIGHTS_FORMAT_MAPPING as names

    if hasattr(value, "item"):
        value = value.item()
    return names.get(value, f"unknown format id {value}") if isinstance(value, int) else str(value)


def before_load_8bit(
    module: Any, state_dict: dict[str, Any], prefix: str, device: Any, event: dict[str, Any]
) -> None:
    """Validate and drop ``weight_format``; make SCB reachable where bitsandbytes looks."""
    import torch

    fmt_key, scb_key, weight_key = prefix + "weight_format", prefix + "SCB", prefix + "weight"
    if fmt_key in state_dict:
        name = _format_name(state_dict[fmt_key])
        if name != "row":
            raise PlacementError(
                f"{prefix[:-1] or type(module).__name__}: the checkpoint's int8 weight is in the legacy "
                f"{name!r} layout (weight_format={_format_value(state_dict[fmt_key])}); bitsandbytes 0.45+ "
                "loads only the row-major layout: re-save the checkpoint with a current bitsandbytes"
            )
        del state_dict[fmt_key]  # bitsandbytes pops it only when the weight key is present
    live = module.weight
    saved = state_dict.get(weight_key)
    quantized_ckpt = scb_key in state_dict or (saved is not None and saved.dtype == torch.int8)
    live_quantized = live.dtype == torch.int8 and not module.state.has_fp16_weights
    if not live_quantized:
        if quantized_ckpt:
            raise PlacementError(
                f"{prefix[:-1] or type(module).__name__}: the checkpoint holds int8-quantized state but the "
                f"live layer is not quantized (weight dtype {live.dtype}); load the model quantized "
                "(BitsAndBytesConfig(load_in_8bit=True)) or move the layer to its device first"
            )
        event["passthrough"] = "live layer not quantized; a float checkpoint is bitsandbytes' own business"
        return
    if saved is not None and saved.dtype != torch.int8:
        raise PlacementError(
            f"{weight_key}: the checkpoint weight is {saved.dtype} but the live layer is int8-quantized; "
            "load a float checkpoint before quantizing (from_pretrained quantizes while loading)"
        )
    if scb_key in state_dict and getattr(live, "SCB", None) is None:
        if module.state.SCB is None:
            raise PlacementError(
                f"{prefix[:-1] or type(module).__name__}: the live layer has no row scales (SCB); "
                "it was never quantized"
            )
        live.SCB = module.state.SCB  # bitsandbytes copies the checkpoint's SCB into this, in place
        event["scb_aliased"] = True


def after_load_8bit(module: Any, event: dict[str, Any]) -> None:
    """Put the module's post-forward layout back; keep bitsandbytes' int8 copies in sync."""
    if event.get("passthrough"):
        return
    weight, state = module.weight, module.state
    if event.pop("scb_aliased", False):
        state.SCB = weight.SCB
        weight.SCB = None  # the module's post-forward layout
    if state.CB is None and getattr(weight, "CB", None) is None:
        return
    if hasattr(weight, "ds_shape"):  # ZeRO-3: weight.data is a placeholder until gathered
        _resync_at_next_forward(module)
        event["cb_resync"] = "at the next forward, once DeepSpeed has gathered the weight (ZeRO-3)"
        return
    data = weight.data
    for holder in (state, weight):
        cb = getattr(holder, "CB", None)
        if cb is not None and cb.data_ptr() != data.data_ptr() and cb.shape == data.shape:
            holder.CB = data  # forward computes with (and writes back) this copy
            event["cb_resync"] = "re-aliased to the loaded weight"


def _resync_at_next_forward(module: Any) -> None:
    if module.__dict__.get("_accelreg_cb_resync") is not None:
        return

    def resync(mod: Any, args: Any) -> None:
        import torch

        weight = mod.weight
        if tuple(weight.data.shape) != tuple(weight.ds_shape):
            return  # not gathered yet; try again at the next call
        # bitsandbytes keeps a private full int8 copy (state.CB, or weight.CB before its first
        # forward); DeepSpeed restored only the partition. Never alias the gathered tensor: ZeRO-3
        # frees it after the forward.
        if mod.state.CB is not None:
            if not torch.equal(mod.state.CB, weight.data):
                mod.state.CB = weight.data.clone()
        elif getattr(weight, "CB", None) is not None and not torch.equal(weight.CB, weight.data):
            weight.CB = weight.data.clone()
        handle = mod.__dict__.pop("_accelreg_cb_resync", None)
        if handle is not None:
            handle.remove()

    # Registered now, i.e. after DeepSpeed's gather pre-hook: it runs once the weight is whole.
    module.__dict__["_accelreg_cb_resync"] = module.register_forward_pre_hook(resync)


def before_load_4bit(
    module: Any, state_dict: dict[str, Any], prefix: str, device: Any, event: dict[str, Any]
) -> None:
    """Consume the quantization-state components and rebuild the live state from them."""
    from bitsandbytes.functional import QuantState

    weight_key = prefix + "weight"
    live = module.weight
    state = getattr(live, "quant_state", None) or getattr(module, "quant_state", None)
    live_quantized = state is not None and getattr(live, "bnb_quantized", False)
    saved = state_dict.get(weight_key)
    component_keys = [k for k in state_dict if k.startswith(weight_key + ".")]
    if not live_quantized and not component_keys and (saved is None or saved.is_floating_point()):
        event["passthrough"] = "live layer not quantized; a float checkpoint is bitsandbytes' own business"
        return
    parts = {k[len(weight_key) + 1 :]: state_dict.pop(k) for k in component_keys}  # never reach torch
    name = prefix[:-1] or type(module).__name__
    if not live_quantized:
        raise PlacementError(
            f"{name}: the checkpoint holds 4-bit quantized state but the live layer is not quantized; "
            "load the model quantized (BitsAndBytesConfig(load_in_4bit=True)) or move the layer to its "
            "device first"
        )
    if getattr(state, "packing_format_for_cpu", False):
        from bitsandbytes.functional import _convert_weight_packed_for_cpu_inverse

        live.data, state = _convert_weight_packed_for_cpu_inverse(live.data, state)
        live.quant_state = module.quant_state = state
        event["unpacked_cpu_format"] = True
    if saved is not None and (saved.dtype != live.dtype or tuple(saved.shape) != tuple(live.shape)):
        raise PlacementError(
            f"{weight_key}: the checkpoint's {tuple(saved.shape)} {saved.dtype} does not match the live "
            f"packed 4-bit weight {tuple(live.shape)} {live.dtype}"
        )
    if not parts:
        if saved is not None:
            event["note_state"] = "the checkpoint has no quantization state; the live state was kept"
        return
    try:
        loaded = QuantState.from_dict(dict(parts), device=device)  # from_dict pops from its argument
    except (ValueError, AssertionError, KeyError, TypeError) as exc:
        raise PlacementError(
            f"{name}: unsupported 4-bit quantization state in the checkpoint "
            f"(components {sorted(parts)}): {exc or type(exc).__name__}"
        ) from exc
    if loaded.quant_type != state.quant_type or tuple(loaded.shape) != tuple(state.shape):
        raise PlacementError(
            f"{name}: the checkpoint's quantization state is {loaded.quant_type} {tuple(loaded.shape)}, "
            f"the live layer's {state.quant_type} {tuple(state.shape)}; refusing to load it"
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
        dst.shape, dst.dtype, dst.blocksize, dst.quant_type = (
            src.shape,
            src.dtype,
            src.blocksize,
            src.quant_type,
        )
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
