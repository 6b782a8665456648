"""``python -m accelreg_emu``: build the extension ahead of time, or show the configuration.

python -m accelreg_emu build            # both variants, in parallel
python -m accelreg_emu build privateuse1
python -m accelreg_emu info
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

VARIANTS = ("privateuse1", "hpu")


def _build(variants: list[str]) -> int:
    if len(variants) == 1:
        from ._build import load_library

        print(load_library(variants[0]))
        return 0
    # One compiler process per variant: each is a single translation unit, so two run in
    # about the time of one on a machine with two cores.
    procs = [subprocess.Popen([sys.executable, "-m", "accelreg_emu", "build", v]) for v in variants]
    return max(p.wait() for p in procs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m accelreg_emu", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="compile the extension into the cache (if not there yet)")
    build.add_argument(
        "variants", nargs="*", metavar="VARIANT", help=f"any of {', '.join(VARIANTS)} (default: all)"
    )
    sub.add_parser("info", help="print the configuration and library paths as JSON")
    args = parser.parse_args(argv)
    if args.command == "build":
        unknown = sorted(set(args.variants) - set(VARIANTS))
        if unknown:
            parser.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
        return _build(list(dict.fromkeys(args.variants)) or list(VARIANTS))
    from . import config
    from ._build import cache_root, library_path

    info = dict(config())
    info["cache_root"] = str(cache_root())
    info["libraries"] = {
        v: {"path": str(library_path(v)), "built": library_path(v).exists()} for v in VARIANTS
    }
    print(json.dumps(info, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
