"""The raylets a process starts: their environment gets ``ACCELREG_AUTO_INSTALL=1`` (every worker
they start installs accelreg's integrations too) and accelreg's resources as unit-instance
resources, and the node's failing backends are reported (``ray._private.services.start_raylet``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

from .managers import _groups, _report_failing, log

#: The opt-in variable of :mod:`accelreg.launch.startup` (a layer above this one): set in the
#: environment of the raylets this process starts, so their workers install accelreg too.
AUTO_INSTALL_VAR = "ACCELREG_AUTO_INSTALL"


_SERVICES = "ray._private.services"


#: Ray's setting (read from the environment by the raylet) that lists the resources whose units
#: are device instances, each handed to one task at a time with its own id. Ray lists its own
#: accelerators there (``GPU`` is built in); a resource missing from it gets id 0 for every task,
#: so two tasks given one unit each would share one device.
UNIT_INSTANCE_VAR = "RAY_custom_unit_instance_resources"


_BUILT_IN_UNITS = ("CPU", "GPU", "memory", "object_store_memory")


def _unit_instance_resources(env: Mapping[str, str]) -> str | None:
    """The value of :data:`UNIT_INSTANCE_VAR` for a raylet: the one the user set (or Ray's own
    accelerator names) plus every resource accelreg offers; ``None`` when nothing is added."""
    from ray._private import accelerators

    given = env.get(UNIT_INSTANCE_VAR, os.environ.get(UNIT_INSTANCE_VAR))
    if given is not None:
        names = [n.strip() for n in given.split(",") if n.strip()]
    else:  # Ray's default: the resource of each of its accelerator managers but the GPU
        names = sorted(m.get_resource_name() for m in accelerators.get_all_accelerator_managers())
    missing = [r for r in _groups() if r not in names]
    if given is not None and not missing:
        return None
    return ",".join(n for n in dict.fromkeys([*names, *missing]) if n not in _BUILT_IN_UNITS)


def _start_raylet(original: Any) -> Any:
    @functools.wraps(original)
    def start_raylet(*args: Any, **kwargs: Any) -> Any:
        env = dict(kwargs.get("env_updates") or {})
        if AUTO_INSTALL_VAR not in os.environ and AUTO_INSTALL_VAR not in env:
            env[AUTO_INSTALL_VAR] = "1"  # the raylet's workers install accelreg's integrations too
        try:
            units = _unit_instance_resources(env)
        except Exception as exc:  # noqa: BLE001 - a node must start; say what is lost
            units = None
            log.warning("accelreg: %s not set (%s): tasks may share a device", UNIT_INSTANCE_VAR, exc)
        if units is not None:
            env[UNIT_INSTANCE_VAR] = units  # one device per unit, with its own id
        kwargs["env_updates"] = env
        try:
            for resource in _groups():
                _report_failing(resource)
        except Exception as exc:  # noqa: BLE001 - a report must not stop a node from starting
            log.warning("accelreg: could not check this node's backends: %s", exc)
        return original(*args, **kwargs)

    return start_raylet
