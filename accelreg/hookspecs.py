"""The vendor contract: the hooks a backend plugin implements.

A plugin is any module or object with functions decorated by ``hookimpl`` (from
:mod:`accelreg.plugin`, the one module a plugin author imports; also :data:`accelreg.hookimpl`).
It reaches accelreg through the ``accelreg`` entry-point group (the entry-point name is the
backend name) or through :func:`accelreg.register`. Hooks only ever exchange the frozen
records of :mod:`accelreg.types`. Each plugin's implementation is called alone and contained;
``optionalhook=True`` marks one for a hook a newer accelreg has; hook wrappers are refused.
"""

from __future__ import annotations

from collections.abc import Iterable

import pluggy

from .types import BackendSpec, PlacementRule

PROJECT = "accelreg"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def accelreg_backends() -> Iterable[BackendSpec]:
    """Declare the backends this plugin provides.

    Called once per registry build. Return (or yield) :class:`~accelreg.types.BackendSpec`
    records. Do no device work here: put it in the spec's probes, which accelreg calls lazily,
    caches, and contains (a probe that raises makes the backend unavailable "because
    probe raised: ..."; it never breaks other backends).

    A spec whose name a built-in also uses replaces the built-in. Two external plugins for one
    name are a conflict unless configuration picks one (``providers = {name = "dist"}``).

    Declare the ``torch.distributed`` backend your runtime registers for collectives on its
    tensors (``dist_backend="acme_ccl"``): :func:`accelreg.dist_backend` answers it to
    frameworks, and DeepSpeed's accelerator reports it (DeepSpeed then runs on your backend with
    no class of its own for it; see docs/integrations.md).

    For bug reports, ``versions`` (``() -> {what: version}``: your package's, the runtime's and
    the driver's, as far as the runtime can say; asked even when the backend is unavailable, so
    cheap and without importing what is absent) and ``device_name`` (``(index) -> str``, each
    device's product name) are what ``accelreg env`` and ``accelreg env --report`` show.

    On a Slurm cluster, ``gres`` names the GRES types your devices are declared as (default:
    the backend name; ``("acme", "gpu")`` where sites declare them as Slurm's ``gpu`` type):
    in a task of a Slurm step, ``accelreg run`` makes the devices Slurm allocated to the task
    your ``visible_devices_var`` (docs/scaling.md, "Slurm").
    Where your hardware can be seen without your runtime (device nodes your kernel driver
    creates, your PCI vendor id), declare it as ``hardware=HardwareSignature(...)``: on a
    machine that has the hardware but not your package, ``accelreg env`` names it and says
    what to install. It is data (accelreg looks, nothing is imported) and only reports.
    Say what your devices compute in with ``dtypes``: a mapping declared once
    (``{"bfloat16": True, "float16": True, "float8_e4m3fn": False}``) or a probe ``(index) ->
    mapping`` that asks your runtime about device ``index``. :func:`accelreg.capabilities`
    answers it to frameworks (bf16/fp16 mixed precision, fp8); what you leave out is asked of
    ``torch.<device_type>.is_bf16_supported()`` and ``.get_amp_supported_dtype()``, and is
    otherwise unknown (never ``False``). The conformance kit checks that every dtype you answer
    ``True`` computes on your devices (docs/plugins.md, "What your devices compute in").
    For vLLM, declare the platform that serves your backend (``vllm_platform="acme"``: your
    vLLM platform plugin's entry-point name, one of vLLM's own, or a class path); declare none
    (or none of your names is installed) and an installed platform plugin whose platform's
    ``device_type`` is your device type serves it, else accelreg's registry platform
    (docs/plugins.md, "What vLLM gets from your plugin").

    Returns:
        An iterable of ``BackendSpec``.

    Example plugin (``acme_accel/accelreg_plugin.py``, registered in ``pyproject.toml`` as
    ``[project.entry-points.accelreg] acme = "acme_accel.accelreg_plugin"``)::

        from __future__ import annotations

        import importlib.util

        from accelreg import plugin
        from accelreg.plugin import Availability, BackendSpec, HardwareSignature, MemoryInfo


        def _available() -> Availability:
            if importlib.util.find_spec("torch_acme") is None:
                return Availability.no("torch_acme is not installed")
            import torch_acme

            n = torch_acme.device_count()
            if n == 0:
                return Availability.no("torch_acme reports no devices")
            return Availability.yes(f"{n} device(s)")


        def _count() -> int:
            import torch_acme

            return torch_acme.device_count()


        def _memory(index: int) -> MemoryInfo:
            import torch_acme

            free, total = torch_acme.mem_get_info(index)
            return MemoryInfo(free=free, total=total)


        def _name(index: int) -> str:
            import torch_acme

            return torch_acme.get_device_name(index)


        def _dtypes(index: int) -> dict[str, object]:
            import torch_acme

            fp8 = torch_acme.get_device_capability(index) >= (3, 0)
            return {
                "bfloat16": torch_acme.is_bf16_supported(),
                "float16": True,
                "float8_e4m3fn": (fp8, "Acme X3 and later multiply float8"),
                "float8_e5m2": (fp8, "Acme X3 and later multiply float8"),
            }


        def _versions() -> dict[str, str]:
            from importlib.metadata import PackageNotFoundError, version

            try:  # metadata only: asked even when torch_acme is not installed
                return {"torch_acme": version("torch-acme")}
            except PackageNotFoundError:
                return {}


        @plugin.hookimpl
        def accelreg_backends():
            yield BackendSpec(
                name="acme",
                priority=75,
                is_available=_available,
                device_count=_count,
                visible_devices_var="ACME_VISIBLE_DEVICES",
                memory_info=_memory,
                device_name=_name,
                versions=_versions,
                dtypes=_dtypes,  # what each device computes in: accelreg.capabilities()
                dist_backend="acme_ccl",
                description="Acme accelerator (torch_acme)",
                hardware=HardwareSignature(  # seen by accelreg env even without torch_acme
                    what="Acme accelerator",
                    install="torch-acme (pip install torch-acme)",
                    device_nodes=("/dev/acme[0-9]*",),
                    pci_vendors=("0x1234",),
                ),
            )
    """


@hookspec
def accelreg_placement_rules(backend: str) -> Iterable[PlacementRule]:
    """Declare where quantized parameters may live on ``backend``.

    Called lazily, once per backend per registry build, by every plugin: a quantization
    library can add rules for backends it does not own, and a backend plugin can override the
    generic (``backend="*"``) rule with one of its own. When several rules match one
    ``(backend, quant_method)``, a rule for the exact backend beats a ``"*"`` rule, and a rule
    from an external plugin beats a built-in one.

    Args:
        backend: The backend name the rules are asked for (``"npu"``).

    Returns:
        An iterable of :class:`~accelreg.types.PlacementRule`.

    Example plugin (a quantization library that keeps 8-bit weights on the device)::

        from __future__ import annotations

        from accelreg import plugin
        from accelreg.plugin import PlacementRule


        @plugin.hookimpl
        def accelreg_placement_rules(backend: str):
            if backend == "cpu":
                return []
            return [
                PlacementRule(
                    backend=backend,
                    quant_method="acme_int8",
                    module_classes=("acme_quant.nn.Int8Linear",),
                    travelling_keys=("weight", "scale"),
                    offload=frozenset(),  # accelerator only
                    bits_per_element=8,
                    bytes_per_row=4,
                )
            ]
    """
