"""``accelreg plan MODEL``: build a model on the meta device from its config and plan its device map.

MODEL is a transformers model type (``gpt2``, ``llama``, ``t5``: its default config), the path of
a ``config.json``, or a folder holding one (a downloaded checkpoint); nothing is downloaded and
no weights are read. A Hub id (``openai-community/gpt2``) is refused with the model type it
names and how to plan it offline. The head is ``--task`` (``masked-lm``: ``AutoModelForMaskedLM``)
or ``--class`` (``BertForMaskedLM``); by default ``AutoModelForCausalLM``, else
``AutoModelForSeq2SeqLM``, else ``AutoModel``. The model is built under ``torch.device("meta")``;
remote code is never run. ``--quantization`` sizes the model as bitsandbytes 8-bit / 4-bit from
the placement rules without replacing any module (see docs/planner.md). Exit codes are those of
:mod:`accelreg.cli`.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from ..errors import DeviceError, DeviceMapError, UsageError
from ..meta import TASKS, build_meta_model
from ..meta.build import HF_LIBRARIES
from ..planner import STRATEGIES, plan
from ..planner.budgets import missing_devices
from ..planner.report import explain, rows
from ..sizes import format_size
from ._format import table

__all__ = ["add_plan_parser", "cmd_plan", "parse_max_memory"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def parse_max_memory(text: str) -> dict[Any, str]:
    """``"npu:0=20GiB,npu:1=20GiB,cpu=64GiB"`` -> ``{"npu:0": "20GiB", ...}`` (``0=...`` -> int key)."""
    out: dict[Any, str] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise UsageError(f"--max-memory item {item!r} is not DEVICE=SIZE (e.g. npu:0=20GiB)")
        parsed: Any = int(key) if key.isdecimal() and key.isascii() else key
        if parsed in out:
            raise UsageError(f"--max-memory names {key!r} twice")
        out[parsed] = value
    if not out:
        raise UsageError("--max-memory is empty; give DEVICE=SIZE[,DEVICE=SIZE...]")
    return out


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's layout, without breaking ``sequence-classification`` or a Hub id at a hyphen."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return textwrap.fill(
            " ".join(text.split()),
            width,
            initial_indent=indent,
            subsequent_indent=indent,
            break_on_hyphens=False,
        )


def add_plan_parser(subparsers: Any) -> None:
    """Register ``accelreg plan`` on the ``accelreg`` command's subparsers."""

    p = subparsers.add_parser(
        "plan",
        formatter_class=_HelpFormatter,
        help="plan a tied-weight-aware device map for a model built on the meta device",
        description=(
            "Plan a device map for MODEL, built on the meta device from its config: no download, no "
            "weights, no remote code. MODEL is a transformers model type (gpt2, llama, t5: that type's "
            "default config), the path of a config.json, or a folder holding one (a downloaded "
            "checkpoint). A Hub id such as openai-community/gpt2 is not fetched: download its "
            "config.json (or the whole checkpoint) and pass that path."
        ),
        epilog=(
            "The head: by default AutoModelForCausalLM, else AutoModelForSeq2SeqLM, else AutoModel. "
            "--task picks an Auto class (bert --task masked-lm builds BertForMaskedLM); --class names "
            "the transformers model class itself. Exit codes: 0 ok, 1 no map fits (or --plot failed, "
            "after the plan is printed), 2 usage error."
        ),
    )
    p.add_argument(
        "model", metavar="MODEL", help="model type, path of a config.json, or a folder holding one"
    )
    head = p.add_mutually_exclusive_group()
    head.add_argument(
        "--task",
        metavar="TASK",
        help=f"the head to build, one of: {', '.join(TASKS)}",
    )
    head.add_argument(
        "--class",
        dest="model_class",
        metavar="NAME",
        help="the transformers model class to build, e.g. BertForMaskedLM (of MODEL's type)",
    )
    p.add_argument(
        "--max-memory",
        metavar="DEV=SIZE[,...]",
        help="budgets, e.g. npu:0=20GiB,npu:1=20GiB,cpu=64GiB,disk=1TB (default: this machine via the registry)",
    )
    p.add_argument("--dtype", help="dtype the weights will be loaded in: float16, bfloat16, float32, auto")
    p.add_argument("--strategy", default="balanced", choices=list(STRATEGIES), help="default: balanced")
    p.add_argument(
        "--quantization", choices=["8bit", "4bit"], help="plan for bitsandbytes 8-bit or 4-bit weights"
    )
    p.add_argument(
        "--no-split", metavar="CLASS[,CLASS]", help="module classes never split (default: the model's)"
    )
    p.add_argument(
        "--patch-free",
        action="store_true",
        help="plan as accelreg.device_map_for does, for stock from_pretrained without install(): every "
        "accelerator keeps the offload headroom (stock accelerate picks the main device by hash order)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--plot", metavar="FILE", help="draw per-device memory bars to FILE.png or FILE.svg")
    p.add_argument(
        "--explain", action="store_true", help="say why each offloaded unit could not stay on an accelerator"
    )
    p.add_argument(
        "--search-limit",
        metavar="NODES",
        type=int,
        help="nodes the search for the most accelerator-resident map may visit (default 20000)",
    )
    p.set_defaults(func=cmd_plan)


def _fail(args: argparse.Namespace, code: int, message: str, violations: tuple[str, ...] = ()) -> int:
    if args.json:
        print(json.dumps({"error": message, "violations": list(violations)}, indent=2))
    else:
        print(f"accelreg plan: {message}", file=sys.stderr)
        for line in violations:
            print(f"  - {line}", file=sys.stderr)
    return code


def cmd_plan(args: argparse.Namespace) -> int:

    try:
        max_memory = parse_max_memory(args.max_memory) if args.max_memory is not None else None
        no_split = [c.strip() for c in args.no_split.split(",") if c.strip()] if args.no_split else None
        if args.plot and Path(args.plot).suffix.lower() not in (".png", ".svg"):
            raise UsageError(f"--plot {args.plot!r}: the file name must end in .png or .svg")
        started = time.perf_counter()
        try:
            model, built = build_meta_model(args.model, task=args.task, model_class=args.model_class)
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".", 1)[0] not in HF_LIBRARIES:
                raise
            return _fail(args, EXIT_FAILED, str(exc))
        build_s = time.perf_counter() - started
        dtype = args.dtype or ("float16" if args.quantization else None)
        started = time.perf_counter()
        result = plan(
            model,
            max_memory,
            no_split_module_classes=no_split,
            strategy=args.strategy,
            dtype=dtype,
            quantization=args.quantization,
            search_limit=args.search_limit,
            any_main=args.patch_free,
        )
        plan_s = time.perf_counter() - started
        missing = missing_devices(result.device_map.values())
    except UsageError as exc:
        return _fail(args, EXIT_USAGE, str(exc))
    except DeviceMapError as exc:
        return _fail(args, EXIT_FAILED, str(exc), exc.violations)
    except DeviceError as exc:
        return _fail(args, EXIT_FAILED, str(exc))
    except (ValueError, TypeError) as exc:  # bad sizes, keys or dtype in the arguments
        return _fail(args, EXIT_USAGE, str(exc))

    plotted = plot_error = None
    if args.plot:
        try:
            plotted = str(_plot(result, args.plot, built))
        except ImportError:
            return _fail(args, EXIT_FAILED, "--plot needs matplotlib (pip install 'accelreg[plot]')")
        except OSError as exc:  # the plan is still good: print it, then say why there is no plot
            plot_error = f"--plot {args.plot!r}: cannot write the file: {exc.strerror or exc}"

    explained = explain(result, args.search_limit) if args.explain else None
    if args.json:
        data = result.as_dict()
        if explained is not None:
            data["explain"] = explained
        data.update(
            model=args.model,
            built=built,
            parameters=sum(p.numel() for p in model.parameters()),
            build_seconds=round(build_s, 4),
            plan_seconds=round(plan_s, 4),
            plot=plotted,
            missing_devices=missing,
        )
        if plot_error:
            data["plot_error"] = plot_error
        print(json.dumps(data, indent=2))
        return _plot_failed(plot_error)

    dtype_note = result.dtype or "checkpoint dtypes"
    quant = f", {result.quantization}" if result.quantization else ""
    print(
        f"{built}: {format_size(result.total)} in {dtype_note}{quant}; strategy {result.strategy}; "
        f"budgets from {result.budgets.source}"
    )
    print()
    print(table(rows(result), ["place", "used", "budget", "headroom", "share", "layers"]))
    on = f"on accelerators: {format_size(result.resident)} of {format_size(result.total)} ({100 * result.resident_share:.1f} %)"
    if result.main_device is not None and result.any_main:
        used = ", ".join(u.place for u in result.places if u.headroom and u.place not in ("cpu", "disk"))
        on += f"; each of {used} keeps the headroom to run the offloaded layers (stock dispatch picks one)"
    elif result.main_device is not None:
        on += f"; main device {result.main_device} runs the offloaded layers"
    if result.optimal is not None:
        on += "; no map keeps more" if result.optimal else "; the search stopped at its limit"
    print(on)
    reserved = {usage.place for usage in result.places if usage.headroom}
    if reserved:
        why = []
        if reserved - {"cpu"}:
            where = "on each accelerator used" if result.any_main else "on the main device"
            why.append(f"{where} to run the largest offloaded layer")
        if "cpu" in reserved:
            why.append("on the cpu to stage the largest disk-offloaded layer")
        print(f"headroom: space reserved (not free) {'; '.join(why)}")
    for note in result.notes:
        print(f"note: {note}")
    by_reason: dict[str, list[str]] = {}
    for place, why in missing.items():
        by_reason.setdefault(why, []).append(place)
    for why, places in by_reason.items():
        them = "them" if len(places) > 1 else "it"
        print(
            f"note: this process has no {', '.join(places)} ({why}): the map is for a machine that has {them}"
        )
    if explained is not None:
        print()
        print("why:")
        for line in explained:
            print(f"  {line}")
    print()
    print("device_map:")
    width = max((len(k) for k in result.device_map), default=0)
    for key, place in result.device_map.items():
        print(f"  {(key or '(whole model)').ljust(width)}  {place}")
    print()
    print(f"built on meta in {build_s:.2f} s; planned in {1000 * plan_s:.1f} ms")
    if plotted:
        print(f"plot written to {plotted}")
    return _plot_failed(plot_error)


def _plot_failed(error: str | None) -> int:
    if error is None:
        return EXIT_OK
    sys.stdout.flush()  # the plan first, then the error
    print(f"accelreg plan: {error}", file=sys.stderr)
    return EXIT_FAILED


def _plot(result: Any, path: str, title: str) -> Path:
    from ..planner.plot import plot_plan  # matplotlib: only when a plot is asked for

    return plot_plan(result, path, title=title)
