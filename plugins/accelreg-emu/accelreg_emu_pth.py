"""Run at interpreter start by ``accelreg_emu_shims.pth`` when ACCELREG_EMU_NAME is set.

Appends ``accelreg_emu/shims/<name>`` to ``sys.path`` so that the vendor stand-in package
(``torch_npu``, ``torch_mlu``, ``torch_musa``, ``torch_sdaa``, ``habana_frameworks``) is
importable in this process, and in no other. It imports nothing but ``os`` and ``sys``
(never torch): activation happens when the stand-in is imported.

Under ``hpu`` it also brings the emulated runtime up the moment ``torch`` has finished
importing, as torch's device-backend autoload does for Intel Gaudi (torch calls the
``torch.backends`` entry point of ``habana_frameworks``, which imports
``habana_frameworks.torch``), and like it only while ``TORCH_DEVICE_BACKEND_AUTOLOAD`` is
``1`` (torch's own switch, on by default). HPU is torch's in-tree device type, whose
accelerator hooks torch reads once per process: a runtime that came up only after something
had asked ``torch.accelerator`` (transformers does at import) would find torch settled on "no
accelerator" for good, and every backward pass on the device would fail. Under the
PrivateUse1 names torch looks the hooks up on every query, so those come up on first use.
"""

import os
import sys

#: The stand-in package that torch's autoload brings up for each name (only hpu needs it).
_AUTOLOAD = {"hpu": "habana_frameworks.torch"}


class _AfterTorch:
    """On ``sys.meta_path`` until torch is imported: wraps torch's loader so that the vendor
    package is imported right after torch's own code has run. It imports nothing in
    ``find_spec`` (``importlib.util.find_spec("torch")`` imports nothing either)."""

    def __init__(self, package: str) -> None:
        self.package = package

    def find_spec(self, fullname, path, target=None):
        if fullname != "torch":
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is None:
                continue
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _ThenAutoload(spec.loader, self)
            return spec
        return None


class _ThenAutoload:
    """torch's own loader, followed by the autoload of the vendor package."""

    def __init__(self, inner, finder: _AfterTorch) -> None:
        self._inner = inner
        self._finder = finder

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        try:
            self._inner.exec_module(module)
        finally:
            if self._finder in sys.meta_path:
                sys.meta_path.remove(self._finder)
        _autoload(self._finder.package)


def _autoload(package: str) -> None:
    """Import ``package`` (it activates the emulator); a failure never breaks ``import torch``.

    A misconfiguration stays silent here: importing the package, or accelreg's probe, reports
    it naming the variable. Anything else is one warning, and happens again on first use.
    """
    try:
        __import__(package)
    except Exception as exc:  # noqa: BLE001 - never raise into the user's `import torch`
        from accelreg_emu import EmuConfigError

        if isinstance(exc, EmuConfigError):
            return
        message = (
            f"accelreg-emu: the emulated runtime did not come up when torch was imported "
            f"(autoload of {package}): {type(exc).__name__}: {exc}"
        )
        try:
            import warnings

            warnings.warn(message, RuntimeWarning, stacklevel=2)
        except Exception:  # noqa: BLE001 - a warnings filter set to "error"
            sys.stderr.write(message + "\n")


def _install() -> None:
    name = os.environ.get("ACCELREG_EMU_NAME", "").strip().lower()
    if not name or not name.isalpha():
        return
    here = os.path.dirname(os.path.abspath(__file__))
    shims = os.path.join(here, "accelreg_emu", "shims", name)
    if os.path.isdir(shims) and shims not in sys.path:
        sys.path.append(shims)
    package = _AUTOLOAD.get(name)
    if (
        package is not None
        and "torch" not in sys.modules
        and os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") == "1"
    ):
        sys.meta_path.insert(0, _AfterTorch(package))


_install()
