"""Fake vLLM platform plugins and accelreg backends for the vLLM tests (no tests here).

Each fake vLLM platform plugin is a real distribution in its own folder (``<dist>.dist-info``
with an ``entry_points.txt`` in vLLM's ``vllm.platform_plugins`` group, and its module), which a
test puts on ``sys.path``: vLLM and accelreg find it exactly as they find an installed vendor
plugin. The modules are named ``fakeplugin_*`` so the suite forgets them after each test.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import accelreg
from accelreg.types import Availability, BackendSpec

#: plugin name -> (distribution, the module's source). Every platform class is vLLM's
#: ``Platform`` with a device-control variable of its own.
PLUGINS: dict[str, tuple[str, str]] = {
    "alpha": (
        "fake-alpha",
        """
        from vllm.platforms.interface import Platform, PlatformEnum

        class AlphaPlatform(Platform):
            _enum = PlatformEnum.OOT
            device_name = device_type = "cpu"
            device_control_env_var = "ALPHA_VISIBLE"

        def activate():
            return "fakeplugin_alpha.AlphaPlatform"
        """,
    ),
    "beta": (
        "fake-beta",
        """
        from vllm.platforms.interface import Platform, PlatformEnum

        class BetaPlatform(Platform):
            _enum = PlatformEnum.OOT
            device_name = device_type = "cpu"

        def activate():
            return "fakeplugin_beta.BetaPlatform"
        """,
    ),
    "sleepy": (  # installed, but says it is not active here
        "fake-sleepy",
        """
        def activate():
            return None
        """,
    ),
    "raising": (  # its activation raises
        "fake-raising",
        """
        def activate():
            raise RuntimeError("the raising driver is gone")
        """,
    ),
    "badclass": (  # answers a class path that does not import
        "fake-badclass",
        """
        def activate():
            return "fakeplugin_badclass_gone.GonePlatform"
        """,
    ),
    # active everywhere, each named under an entry point no backend declares: their platforms'
    # device types are what ties them to a backend (issue 40)
    "npu_one": (
        "fake-npu-one",
        '\ndef activate():\n    return "fakeplugin_npu_one_platform.NpuOnePlatform"\n',
    ),
    "npu_two": (
        "fake-npu-two",
        '\ndef activate():\n    return "fakeplugin_npu_two_platform.NpuTwoPlatform"\n',
    ),
    "mlu_one": (
        "fake-mlu-one",
        '\ndef activate():\n    return "fakeplugin_mlu_one_platform.MluOnePlatform"\n',
    ),
    "notype": ("fake-notype", '\ndef activate():\n    return "fakeplugin_notype_platform.NoTypePlatform"\n'),
}

#: The platform classes of the plugins above, each in a module of its own (imported only when
#: its device type is asked): module -> source.
PLATFORMS: dict[str, str] = {
    f"fakeplugin_{plugin}_platform": textwrap.dedent(
        f"""
        from vllm.platforms.interface import Platform, PlatformEnum

        class {cls}(Platform):
            _enum = PlatformEnum.OOT
            {declared}
        """
    )
    for plugin, cls, declared in (
        ("npu_one", "NpuOnePlatform", 'device_name = device_type = "npu"'),
        ("npu_two", "NpuTwoPlatform", 'device_name = device_type = "npu"'),
        ("mlu_one", "MluOnePlatform", 'device_name = device_type = "mlu"'),
        ("notype", "NoTypePlatform", 'device_name = "notype"  # declares no device_type'),
    )
}
#: A plugin whose entry point names a module that does not exist (it fails to load).
BROKEN = ("broken", "fake-broken", "fakeplugin_never_installed:activate")


def install(root: Path, *names: str) -> list[Path]:
    """Write the fake plugins ``names`` (keys of :data:`PLUGINS`, or ``"broken"``) into folders
    under ``root``; returns the folders to put on ``sys.path``."""
    folders = []
    for name in names:
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        if name == BROKEN[0]:
            dist, value = BROKEN[1], BROKEN[2]
        else:
            dist, source = PLUGINS[name]
            (folder / f"fakeplugin_{name}.py").write_text(textwrap.dedent(source))
            module = f"fakeplugin_{name}_platform"
            if module in PLATFORMS:
                (folder / f"{module}.py").write_text(PLATFORMS[module])
            value = f"fakeplugin_{name}:activate"
        info = folder / f"{dist.replace('-', '_')}-1.0.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[vllm.platform_plugins]\n{name} = {value}\n")
        folders.append(folder)
    return folders


def backend(
    name: str,
    priority: int,
    vllm_platform: object = None,
    var: str | None = None,
    device_type: str | None = None,
) -> BackendSpec:
    """An available one-device backend that declares ``vllm_platform`` (its torch device type:
    ``device_type``, else its name)."""
    return BackendSpec(
        name=name,
        device_type=device_type,
        priority=priority,
        is_available=lambda: Availability.yes("fake"),
        device_count=lambda: 1,
        visible_devices_var=var,
        vllm_platform=vllm_platform,  # type: ignore[arg-type]
    )


def register(*specs: BackendSpec, name: str = "acme") -> None:
    """Register an in-process accelreg plugin (``name``) yielding ``specs``."""
    plugin = type(name, (), {})()
    plugin.accelreg_backends = accelreg.hookimpl(lambda: list(specs))
    accelreg.register(plugin, name=name)
