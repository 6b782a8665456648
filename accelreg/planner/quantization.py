"""Which weights of a bitsandbytes 8-bit / 4-bit model are quantized, and how big they are.

The planner never replaces modules: it sizes the weights transformers *would* quantize from the
placement rule (``rule.quantized_nbytes(shape)``) and pins them where ``rule.may_live_on``
allows. Detection, in order:

1. ``quantization=`` given by the caller (``"8bit"``, ``"4bit"``, ``"bnb_8bit"``, ``"nf4"``, ...;
   ``False`` or ``"none"`` turns detection off);
2. modules that already are bitsandbytes layers (``Linear8bitLt``, ``Linear4bit``, ...: the
   rule's ``module_classes``, matched by qualified class name without importing bitsandbytes);
3. a transformers ``model.hf_quantizer`` or ``model.config.quantization_config`` for
   bitsandbytes (``load_in_8bit`` / ``load_in_4bit``).

For 1 and 3 the quantized weights are those transformers' ``replace_with_bnb_linear`` converts:
modules whose type is exactly ``nn.Linear`` or transformers' ``Conv1D``, except
``modules_to_not_convert`` = ``get_keys_to_not_convert(model)`` (tied weights, the output
embeddings, the last module) + ``llm_int8_skip_modules`` + ``_keep_in_fp32_modules``, matched
with transformers' own ``should_convert_module``. Models that are not transformers models get
the same rule computed here (tied weights and the last module stay unquantized).
"""

from __future__ import annotations

from typing import Any

from ..placement import QUANT_METHODS, names_class, placement_rule

__all__ = ["apply_quantization", "detect_method"]

_OFF = (False, "none", "no", "off")


def _config_method(model: Any) -> str | None:
    quantizer = getattr(model, "hf_quantizer", None)
    config = getattr(quantizer, "quantization_config", None)
    if config is None:
        config = getattr(getattr(model, "config", None), "quantization_config", None)
    if config is None:
        return None
    get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
    method = get("quant_method", "") or ""
    method = str(getattr(method, "value", method))
    if "bitsandbytes" not in method:
        return None
    if get("load_in_8bit", False):
        return "bnb_8bit"
    if get("load_in_4bit", False):
        return "bnb_4bit"
    return None


def _class_names(cls: type) -> set[str]:
    return {f"{k.__module__}.{k.__qualname__}" for k in cls.__mro__}


def detect_method(model: Any, layout: Any, quantization: Any) -> tuple[str | None, str]:
    """``(method, why)``: the quantization method that applies, and where it was found."""
    if quantization is False or (isinstance(quantization, str) and quantization.strip().lower() in _OFF):
        return None, "quantization turned off"
    if quantization is not None:
        if not isinstance(quantization, str):
            raise TypeError(f"quantization must be a string such as '8bit' or '4bit', got {quantization!r}")
        method = QUANT_METHODS.get(quantization.strip().lower())
        if method is None:
            accepted = ", ".join(sorted(QUANT_METHODS))
            raise ValueError(
                f"unknown quantization {quantization!r}; accepted: {accepted} (or None to detect)"
            )
        return method, f"quantization={quantization!r}"
    seen: dict[type, str | None] = {}
    for module in layout.modules:
        cls = type(module)
        if cls in seen:
            continue
        names = _class_names(cls)
        found = None
        for short in ("Linear8bitLt",):
            if any(n.startswith("bitsandbytes.") and n.endswith("." + short) for n in names):
                found = "bnb_8bit"
        for short in ("Linear4bit", "LinearNF4", "LinearFP4"):
            if any(n.startswith("bitsandbytes.") and n.endswith("." + short) for n in names):
                found = "bnb_4bit"
        seen[cls] = found
        if found:
            return found, f"{cls.__name__} modules in the model"
    method = _config_method(model)
    if method:
        return method, "the model's quantization_config"
    return None, "no quantization"


def _skip_patterns(model: Any, layout: Any) -> list[str]:
    config = getattr(getattr(model, "hf_quantizer", None), "quantization_config", None)
    if config is None:
        config = getattr(getattr(model, "config", None), "quantization_config", None)
    skip = None
    if config is not None:
        skip = (
            config.get("llm_int8_skip_modules")
            if isinstance(config, dict)
            else getattr(config, "llm_int8_skip_modules", None)
        )
    keep = list(getattr(model, "_keep_in_fp32_modules", None) or [])
    try:
        from transformers import PreTrainedModel
        from transformers.quantizers.base import get_keys_to_not_convert
    except ImportError:  # pragma: no cover - transformers is installed with accelreg[hf]
        PreTrainedModel, get_keys_to_not_convert = None, None
    defaults: list[str] = []
    if skip is None:
        if PreTrainedModel is not None and isinstance(model, PreTrainedModel):
            defaults = list(get_keys_to_not_convert(model))
        else:
            defaults = _default_skips(layout)
    return list({*defaults, *(skip or []), *keep})


def _default_skips(layout: Any) -> list[str]:
    """transformers' ``get_keys_to_not_convert`` for any module: tied weights and the last one."""
    by_storage: dict[Any, list[int]] = {}
    for t, key in enumerate(layout.keys):
        by_storage.setdefault(key, []).append(t)
    skips = set()
    for members in by_storage.values():
        if len(members) > 1:
            skips.update(layout.names[t] for t in members)
    params = [t for t in range(len(layout.names)) if layout.is_param[t]]
    if params:
        skips.add(layout.names[params[-1]])
    return [s.removesuffix(".weight") for s in skips]


def _should_convert(name: str, patterns: list[str]) -> bool:
    try:
        from transformers.quantizers.quantizers_utils import should_convert_module
    except ImportError:  # pragma: no cover
        return not any(name == p or name.startswith(p + ".") or name.endswith(p) for p in patterns)
    return should_convert_module(name, patterns)


def apply_quantization(model: Any, layout: Any, method: str, backend: str, *, replaced_only: bool) -> int:
    """Size and pin the weights that ``method`` quantizes; returns how many there are.

    ``replaced_only``: only modules that already are bitsandbytes layers (detection 2).
    """
    import torch

    rule = placement_rule(backend, method)
    patterns: list[str] = [] if replaced_only else _skip_patterns(model, layout)
    count = 0
    for m, module in enumerate(layout.modules):
        cls = type(module)
        is_bnb = names_class(rule.module_classes, cls) if cls.__module__.startswith("bitsandbytes") else False
        if not is_bnb:
            if replaced_only:
                continue
            if not (
                cls is torch.nn.Linear
                or (cls.__name__ == "Conv1D" and cls.__module__.startswith("transformers"))
            ):
                continue
            if not _should_convert(layout.paths[m], patterns):
                continue
        param = rule.param
        prefix = layout.paths[m] + "." if layout.paths[m] else ""
        for t in range(layout.start[m], layout.own_end[m]):
            if layout.names[t] != prefix + param:
                continue
            weight = layout.tensors[t]
            rows = getattr(module, "out_features", None)
            cols = getattr(module, "in_features", None)
            if rows is None or cols is None:
                shape = tuple(weight.shape)
                if cls.__name__ == "Conv1D" and len(shape) == 2:  # Conv1D stores (in, out)
                    shape = (shape[1], shape[0])
            else:
                shape = (int(rows), int(cols))
            layout.nbytes[t] = rule.quantized_nbytes(shape)
            layout.quantized[t] = (method, rule)
            count += 1
    return count
