"""vLLM: the registry picks vLLM's platform, in every process of an engine.

vLLM runs on exactly one *platform* per process (``vllm.platforms.current_platform``), chosen
once, lazily, the first time anything asks for it, by ``vllm.platforms.resolve_current_platform_cls_qualname``:
its built-in probes (tpu, cuda, rocm, xpu, cpu; a probe that raises is logged at DEBUG and
skipped), then the out-of-tree plugins of the ``vllm.platform_plugins`` entry-point group (filtered
by ``VLLM_PLUGINS``). Two active plugins are an error ("Only one platform plugin can be
activated"); a plugin that fails to load is logged and skipped, and with nothing left vLLM runs
on whatever probe answered — on a machine with a broken vendor plugin, the CPU, silently. The
engine core and every worker are *spawned* processes, each choosing again.

Seam: ``vllm.platforms.resolve_current_platform_cls_qualname`` (no parameters; returns the
class path vLLM instantiates). The replacement asks the registry: its current backend (the
registry's priority, ``ACCELREG_PRIORITY``, masks; under a launcher a present but failing
backend is a :class:`~accelreg.errors.DeviceError`, as for ``resolve()``) and the vLLM platform
that backend declares (:attr:`BackendSpec.vllm_platform <accelreg.types.BackendSpec.vllm_platform>`:
one of vLLM's own, a platform plugin's entry-point name, or a class path). A backend that
declares none, or none of whose declared names is installed here, is served by the one active
platform plugin whose platform's ``device_type`` is the backend's torch device type (two such
plugins are an error naming both), else, for a backend that declares none, by accelreg's
registry platform (:mod:`.platform`). So with several platform plugins installed, the registry's
priority decides which one runs, and the others are never activated twice.

Every process of an engine chooses this way: under ``accelreg run`` each one installs accelreg
at start-up (:mod:`accelreg.launch.startup`); after :func:`accelreg.install` in a script, enabling
this integration sets ``ACCELREG_AUTO_INSTALL=1`` for the processes vLLM spawns (put back by
``disable()``), the documented opt-in of the same hook.

Failures are never a silent fall back to the CPU platform: a platform plugin that fails to load
or to answer is a recorded :class:`~accelreg.types.PluginFailure` (``accelreg env`` lists it); when
it is the platform of the backend the registry chose, or when the choice is the cpu backend
under a launcher (``accelreg run`` included) or in strict mode, the choice raises
:class:`~accelreg.errors.DeviceError` naming it. A declared name that is neither vLLM's nor an
installed plugin's, and a platform class that does not import, are errors naming the accelreg
plugin that declared it. ``ACCELREG_VLLM_PLATFORM`` (a platform name, a class path, or
``registry``) overrides the backend's declaration; ``VLLM_TARGET_DEVICE=cpu`` keeps vLLM's own
meaning (its CPU platform, explicitly).

The folder: :mod:`.selection` (which platform serves the backend), :mod:`.env_report`
(``accelreg env``'s section),
:mod:`.integration` (the row's ``INTEGRATION``), and what vLLM loads by class path in its own
processes: :mod:`.platform` (the registry platform), :mod:`.worker` and :mod:`.attention`
(imported only by vLLM, after it chose the registry platform).
"""

from __future__ import annotations

from .env_report import report
from .integration import INTEGRATION, disable, enable, enabled
from .selection import (
    ENV_PLATFORM,
    GROUP,
    REGISTRY,
    Choice,
    PlatformPlugin,
    check_declared,
    choice,
    choose,
    chosen_backend,
)

__all__ = [
    "ENV_PLATFORM",
    "GROUP",
    "INTEGRATION",
    "REGISTRY",
    "Choice",
    "PlatformPlugin",
    "check_declared",
    "choice",
    "choose",
    "chosen_backend",
    "disable",
    "enable",
    "enabled",
    "report",
]
