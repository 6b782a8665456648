"""Hardware seen without its runtime: what a backend's :class:`~accelreg.types.HardwareSignature`
finds on this machine.

A signature is data (device-node patterns, driver files, PCI vendor ids and class prefixes), so
looking is accelreg's own code: a few ``stat``/``glob`` calls and reads of small sysfs files,
under a root folder (``"/"``; tests build a fake one), nothing imported, nothing that can hang
on a driver. ``accelreg env`` asks it only for backends that are unavailable, to name hardware
whose runtime or plugin is missing.
"""

from __future__ import annotations

import glob
import os

from ..types import HardwareSignature

__all__ = ["MAX_EVIDENCE", "PCI_DEVICES", "seen"]

#: Where Linux lists PCI devices, one folder per address with ``vendor`` and ``class`` files.
PCI_DEVICES = "sys/bus/pci/devices"
#: Pieces of evidence reported per backend; more are summarised as ``"... and N more"``.
MAX_EVIDENCE = 4


def seen(signature: HardwareSignature, root: str = "/") -> tuple[str, ...]:
    """What of ``signature`` exists under ``root``: each device node and file found (as its
    path from ``root``: ``"/dev/davinci0"``), and each matching PCI device
    (``"PCI 0000:3b:00.0 (vendor 0x19e5, class 0x120000)"``); ``()`` when nothing is.

    Never raises: an entry that cannot be read is not evidence."""
    found: list[str] = []
    for pattern in (*signature.device_nodes, *signature.files):
        found.extend(_paths(pattern, root))
    if signature.pci_vendors:
        found.extend(_pci(signature, root))
    unique = list(dict.fromkeys(found))
    if len(unique) > MAX_EVIDENCE:
        unique[MAX_EVIDENCE:] = [f"... and {len(unique) - MAX_EVIDENCE} more"]
    return tuple(unique)


def _paths(pattern: str, root: str) -> list[str]:
    where = os.path.join(root, pattern.lstrip("/"))
    try:
        if glob.has_magic(pattern):
            hits = sorted(glob.glob(where))
        else:
            hits = [where] if os.path.lexists(where) else []
    except (OSError, ValueError):
        return []
    return ["/" + os.path.relpath(hit, root).replace(os.sep, "/") for hit in hits]


def _pci(signature: HardwareSignature, root: str) -> list[str]:
    base = os.path.join(root, PCI_DEVICES)
    try:
        addresses = sorted(os.listdir(base))
    except OSError:
        return []
    out = []
    for address in addresses:
        vendor = _read(os.path.join(base, address, "vendor"))
        if vendor not in signature.pci_vendors:
            continue
        cls = _read(os.path.join(base, address, "class"))
        if signature.pci_classes and not (cls and cls.startswith(signature.pci_classes)):
            continue
        out.append(f"PCI {address} (vendor {vendor}, class {cls or 'unknown'})")
    return out


def _read(path: str) -> str | None:
    """A sysfs attribute (``0x19e5``), lower case, or ``None``."""
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read(64).strip().lower() or None
    except OSError:
        return None
