"""Lightning's import names: the unified ``lightning`` package, and the standalone
``pytorch_lightning`` and ``lightning_fabric`` packages, each with where its halves live.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata


@dataclass(frozen=True)
class Flavor:
    """One import name of Lightning: its top-level package and where its halves live.

    Attributes:
        name: The integration's name (``accelreg.integrations.<name>``).
        distribution: The distribution whose version is read.
        also_shipped_by: Other distributions that install the same package (``lightning_fabric``
            comes alone in ``lightning-fabric`` and bundled in ``pytorch-lightning``); the
            integration reads its version from the one installed.
        fabric: Fabric's package (``"lightning.fabric"``), or ``""``.
        trainer: The Trainer's package (``"lightning.pytorch"``), or ``""``.
    """

    name: str
    distribution: str
    fabric: str = ""
    trainer: str = ""
    also_shipped_by: tuple[str, ...] = ()

    def installed_distribution(self) -> str:
        """The distribution that installed the package here: :attr:`distribution`, else the
        first installed of :attr:`also_shipped_by` (``distribution`` when none is)."""
        for name in (self.distribution, *self.also_shipped_by):
            try:
                metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
            return name
        return self.distribution

    @property
    def top(self) -> str:
        """The top-level package (the trigger and the scan prefix)."""
        return (self.fabric or self.trainer).split(".")[0]


#: The import names: the unified package, and the standalone Trainer and Fabric packages
#: (``pytorch-lightning`` bundles ``lightning_fabric``; ``lightning-fabric`` ships it alone).
FLAVORS: dict[str, Flavor] = {
    "lightning": Flavor("lightning", "lightning", fabric="lightning.fabric", trainer="lightning.pytorch"),
    "pytorch_lightning": Flavor("pytorch_lightning", "pytorch-lightning", trainer="pytorch_lightning"),
    "lightning_fabric": Flavor(
        "lightning_fabric",
        "lightning-fabric",
        fabric="lightning_fabric",
        also_shipped_by=("pytorch-lightning",),
    ),
}
