"""Registering the emulated backend with torch (run once per process by ``activate``)."""

from __future__ import annotations

import atexit
import warnings

import torch

from . import _device
from ._build import load_library
from ._config import COLLECTIVES, EmuConfig


def _rename(name: str) -> None:
    current = torch._C._get_privateuse1_backend_name()
    if current == name:
        return
    if current != "privateuseone":
        raise RuntimeError(
            f"accelreg-emu: PrivateUse1 is already named {current!r} in this process; "
            f"cannot present it as {name!r} (torch allows one name per process)"
        )
    torch.utils.rename_privateuse1_backend(name)


def _tiny_backward(name: str, index: int) -> None:
    """A backward pass that runs on device ``index``'s autograd worker thread.

    It calls the engine directly rather than through ``torch.autograd.backward``, which
    stashes a Python object (a ``contextvars`` copy) in the graph task's thread-local state.
    """
    x = torch.ones(1, device=torch.device(name, index), requires_grad=True)
    y = (x * 2).sum()
    engine = torch.autograd.Variable._execution_engine
    engine.run_backward((y,), (torch.ones_like(y),), False, False, (), True, True)


def _flush_autograd_workers(name: str) -> None:
    """Make every device's autograd worker drop the graph tasks of finished backward passes.

    torch (2.13) captures a Python object in each graph task; the worker thread that finished
    the task can release it just *after* ``backward()`` returns. If the interpreter is
    finalising by then, the worker's GIL acquisition exits the thread in a ``noexcept``
    destructor and the process aborts ("terminate called without an active exception").
    A worker processes its queue in order and drops the previous task before taking the
    next, so one more (Python-free) backward per device, at exit, settles all of them.
    """
    try:
        for index in range(_device.device_count()):
            _tiny_backward(name, index)
    except Exception:  # noqa: BLE001 - best effort at interpreter exit
        pass


#: What torch's autograd engine says on a backward pass on a device it has no queue for.
_NO_QUEUE = "device_ready_queues_"


def _warm_up_autograd(name: str) -> None:
    """Start the autograd engine's device threads now and flush them once more at exit.

    torch sizes the engine's per-device queues once per process, at its first backward pass,
    from the devices registered then. A process that ran a backward pass (on the cpu) before
    the runtime came up has no queue for its devices: every backward pass on them fails
    there, as with a vendor runtime imported after one. The runtime still comes up (its
    tensors, copies and collectives work; a rank that computes on the cpu is unaffected), with
    one warning that says why backward passes on it fail.
    """
    try:
        for index in range(_device.device_count()):
            _tiny_backward(name, index)
    except RuntimeError as exc:
        if _NO_QUEUE not in str(exc):
            raise
        warnings.warn(
            f"accelreg-emu: a backward pass ran in this process before the emulated {name} "
            f"runtime came up, so torch's autograd engine has no queue for {name} devices and "
            f"backward passes on them fail in this process (as with a vendor runtime imported "
            f"after one): bring the runtime up first (import its package, or ask accelreg: "
            f"accelreg.resolve())",
            RuntimeWarning,
            stacklevel=2,
        )
        return
    atexit.register(_flush_autograd_workers, name)


def _check_hpu_hooks(cfg: EmuConfig) -> None:
    """Refuse, in words, an HPU runtime that came up after torch had settled on "no accelerator".

    torch reads the HPU hooks once per process, the first time anything asks
    ``torch.accelerator`` (or the autograd engine runs); hooks registered later are never seen,
    and every backward pass on the device then fails with "Cannot access accelerator device
    when none is available". The emulator comes up at ``import torch`` (``accelreg_emu_pth``,
    as torch's autoload brings up Gaudi's runtime), so this happens only with
    ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` and torch's accelerator asked before the runtime.
    """
    get = getattr(torch._C, "_accelerator_getAccelerator", None)
    if not cfg.device_count or get is None or get() is not None:
        return
    raise RuntimeError(
        "accelreg-emu: torch settled on 'no accelerator' before the emulated HPU runtime came up "
        "(torch.accelerator was asked before habana_frameworks.torch was imported, as happens with "
        "TORCH_DEVICE_BACKEND_AUTOLOAD=0), and torch reads the HPU hooks once per process: import "
        "habana_frameworks.torch before anything asks torch.accelerator, or leave "
        "TORCH_DEVICE_BACKEND_AUTOLOAD at 1 so that the runtime comes up with torch"
    )


def register(cfg: EmuConfig) -> None:
    """Load the extension, size its devices and make ``torch.<name>`` real."""
    assert cfg.name is not None
    name = cfg.name
    if name != "hpu":
        _rename(name)
    load_library("hpu" if name == "hpu" else "privateuse1")
    torch.ops.accelreg_emu.configure(cfg.device_count, list(cfg.capacities))
    if name == "hpu":
        _check_hpu_hooks(cfg)
    torch.ops.accelreg_emu.set_shallow_copy_compatible(cfg.shallow_copy)
    _device._bind(cfg)
    if getattr(torch, name, None) is not _device:
        torch._register_device_module(name, _device)
    if name != "hpu":
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
        )
    if torch.distributed.is_available():
        from ._collectives import register as register_collectives

        register_collectives(COLLECTIVES[name], name)
    if cfg.device_count:
        _warm_up_autograd(name)
