"""DeepSpeed: quantized checkpoints load onto the right device, and DeepSpeed's accelerator
agrees with the registry.

Seam: ``deepspeed.initialize`` (public). Before the engine is built, the placement rules are
attached to the model (:func:`accelreg.placement.attach`), so ``engine.load_checkpoint`` —
which always loads onto the CPU and offers no ``map_location`` — hands each quantized layer
its state on the device of the live weight. The hooks live on the model, so Trainer's
``_load_best_model`` (seed 000) needs nothing beyond ``accelreg.install()``.

DeepSpeed picks its accelerator itself (``DS_ACCELERATOR``, else its own detection ladder).
:func:`accelerator_report` compares it with accelreg's current backend; ``enable()`` switches
DeepSpeed to the registry's backend when the user chose a backend through accelreg
(``priority`` configured) and did not set ``DS_ACCELERATOR``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ._seams import Integration, Seam

__all__ = ["INTEGRATION", "accelerator_report", "disable", "enable", "enabled"]

LIBRARIES = ("transformers", "accelerate", "peft", "deepspeed")


def _initialize(original: Any) -> Any:
    @functools.wraps(original)
    def initialize(*args: Any, **kwargs: Any) -> Any:
        from .. import placement

        model = kwargs.get("model", args[1] if len(args) > 1 else None)
        if model is not None and hasattr(model, "named_modules"):
            placement.attach(model)
        return original(*args, **kwargs)

    return initialize


_saved_accelerator: list[Any] = []


def accelerator_report() -> dict[str, Any]:
    """DeepSpeed's accelerator next to accelreg's current backend."""
    from deepspeed.accelerator import get_accelerator

    import accelreg

    from .. import registry

    ds_name = get_accelerator()._name
    backend = accelreg.current_backend()
    source = registry.get().settings.sources.get("priority", "default")
    return {
        "deepspeed": ds_name,
        "accelreg": backend.device_type,
        "agree": ds_name == backend.device_type,
        "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR"),
        "priority_source": source,
    }


def _align() -> None:
    from deepspeed.accelerator import real_accelerator

    report = accelerator_report()
    if report["agree"] or report["DS_ACCELERATOR"] or report["priority_source"] == "default":
        return
    wanted = report["accelreg"]
    supported = getattr(real_accelerator, "SUPPORTED_ACCELERATOR_LIST", ())
    if wanted not in supported:
        return  # DeepSpeed has no accelerator of that kind; accelreg env reports the mismatch
    _saved_accelerator[:] = [real_accelerator.ds_accelerator, os.environ.get("DS_ACCELERATOR")]
    real_accelerator.ds_accelerator = None
    os.environ["DS_ACCELERATOR"] = wanted
    real_accelerator.get_accelerator()


def _unalign() -> None:
    if not _saved_accelerator:
        return
    from deepspeed.accelerator import real_accelerator

    previous, env = _saved_accelerator
    real_accelerator.ds_accelerator = previous
    if env is None:
        os.environ.pop("DS_ACCELERATOR", None)
    else:
        os.environ["DS_ACCELERATOR"] = env
    _saved_accelerator.clear()


INTEGRATION = Integration(
    name="deepspeed",
    distribution="deepspeed",
    supported=">=0.19.8,<0.20",
    seams=[
        Seam(
            "deepspeed",
            "initialize",
            _initialize,
            params=("args", "model", "optimizer"),
            why="attach the quantized-weight placement rules to the model before the engine is built",
        )
    ],
    scan_prefixes=LIBRARIES,
    on_enable=_align,
    on_disable=_unalign,
)


def enable() -> None:
    """Enable the DeepSpeed integration (idempotent)."""
    INTEGRATION.enable()


def disable() -> None:
    """Restore DeepSpeed exactly as it was."""
    INTEGRATION.disable()


@contextmanager
def enabled() -> Iterator[None]:
    """Enable for a block."""
    with INTEGRATION.enabled_for():
        yield
