"""Build a transformers model on the meta device, and plan its device map without patching.

:func:`build_meta_model` makes an empty model (no weights, no download, no remote code) from a
model type (``"gpt2"``: its default config), a config object, or a local folder holding a
``config.json`` (a checkpoint folder). :func:`device_map_for` plans a fully qualified device
map for such a model with the registry's devices: the patch-free path that works on every
transformers release, for frameworks that forbid monkeypatching::

    device_map = accelreg.device_map_for("path/to/checkpoint", {"npu:0": "20GiB", "cpu": "64GiB"})
    model = AutoModelForCausalLM.from_pretrained("path/to/checkpoint", device_map=device_map)
"""

from __future__ import annotations

import contextlib
import difflib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = ["MetaModelError", "build_meta_model", "device_map_for"]


class MetaModelError(ValueError):
    """What was given cannot be built into a model (``accelreg plan`` exits 2 on it)."""


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    import transformers

    previous = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(previous)


def _config_for(spec: Any) -> tuple[Any, str]:
    from transformers import AutoConfig, PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if isinstance(spec, PretrainedConfig):
        return spec, f"{type(spec).__name__} ({spec.model_type})"
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str):
        raise TypeError(
            "expected a model on meta, a transformers config, a model type or a local checkpoint folder, "
            f"got {type(spec).__name__}"
        )
    path = Path(spec)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise MetaModelError(f"{spec!r} is a directory without a config.json")
        config = AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
        return config, f"{spec} ({config.model_type})"
    if spec not in CONFIG_MAPPING:
        close = difflib.get_close_matches(spec, list(CONFIG_MAPPING.keys()), n=5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise MetaModelError(
            f"{spec!r} is neither a transformers model type nor a directory with a config.json{hint}"
        )
    return AutoConfig.for_model(spec), f"{spec} (default config)"


def build_meta_model(spec: Any) -> tuple[Any, str]:
    """``(model on meta, what was built)`` for a model type, a config object, or a local
    folder with a ``config.json``. Built with ``AutoModelForCausalLM.from_config``, else
    ``AutoModelForSeq2SeqLM``, else ``AutoModel``; remote code is never run."""
    import torch
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM

    with _quiet_transformers():
        config, source = _config_for(spec)
        errors = []
        for auto in (AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoModel):
            try:
                with torch.device("meta"):
                    model = auto.from_config(config)
            except ValueError as exc:  # this auto class has no mapping for the config
                errors.append(f"{auto.__name__}: {exc}")
                continue
            return model, f"{source} as {type(model).__name__}"
    raise MetaModelError(f"transformers cannot build {source}: " + "; ".join(e[:200] for e in errors))


def device_map_for(
    model: Any,
    max_memory: Mapping[Any, Any] | None = None,
    *,
    strategy: str = "balanced",
    dtype: Any = None,
    no_split_module_classes: list[str] | None = None,
    quantization: str | None = None,
) -> dict[str, str]:
    """A fully qualified device map for ``model``, planned without patching anything.

    Args:
        model: A model (on meta or not), a transformers config, a model type (``"gpt2"``) or
            a local checkpoint folder (its ``config.json`` is read; weights are not).
        max_memory: Budgets as for :func:`accelreg.plan_device_map` (``{"npu:0": "20GiB",
            "cpu": "64GiB", "disk": "1TB"}``; int keys are indices of the current backend);
            default: the registry's devices of the current backend and the host.
        strategy: ``"balanced"`` (default), ``"auto"``, ``"balanced_low_0"`` or ``"sequential"``.
        dtype: The dtype the weights will be loaded in (default: the model's own).
        no_split_module_classes: Module classes never split (default: the model's own).
        quantization: ``"8bit"`` / ``"4bit"`` to plan bitsandbytes weights.

    Returns:
        ``{module name: "npu:0" | "cpu" | "disk"}``: tied parameter groups on one device, every
        value a device of the registry — pass it to ``from_pretrained(device_map=...)`` or
        ``accelerate.dispatch_model`` on any transformers release, without ``install()``.
    """
    from .integrations import raise_recorded
    from .planner import plan

    raise_recorded()
    if not hasattr(model, "named_parameters"):
        model, _ = build_meta_model(model)
    if no_split_module_classes is None:
        getter = getattr(model, "_get_no_split_modules", None)
        found = getter("auto") if callable(getter) else getattr(model, "_no_split_modules", None)
        no_split_module_classes = sorted(found or ()) or None
    result = plan(
        model,
        dict(max_memory) if max_memory is not None else None,
        no_split_module_classes=no_split_module_classes,
        strategy=strategy,
        dtype=dtype,
        quantization=quantization,
    )
    return dict(result.device_map)
