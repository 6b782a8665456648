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
import difflib
import json
import re
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import registry
from ..errors import DeviceError, DeviceMapError, UsageError
from ..meta import TASKS, build_meta_model
from ..meta.build import HF_LIBRARIES
from ..planner import STRATEGIES, plan
from ..planner.budgets import missing_devices
from ..planner.dtypes import DTYPE_NAMES
from ..planner.report import explain, rows
from ..sizes import format_size, parse_size
from ._format import did_you_mean, table

__all__ = ["add_parser", "cmd_plan", "parse_max_memory"]

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


def _positive(text: str) -> int:
    """``--search-limit``: a positive int (argparse reports anything else as a usage error)."""
    if not (text.isascii() and text.isdecimal()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of nodes")
    return int(text)


_DEVICE = re.compile(r"(?P<name>[a-z][a-z0-9_]*)(?::(?P<index>[0-9]{1,9}))?")


def _check_budgets(max_memory: dict[Any, str]) -> None:
    """Refuse, before anything is imported or built, a ``--max-memory`` that names a device no
    registered backend has (a typo: ``gpu:0``, ``npu0``) or a size that is none (``lots``).

    Keys are checked against the names of the backends registered here, available or not (a
    plan may be for another machine; a backend whose plugin is not installed is unknown)."""
    snap = registry.get()
    names = {b.name for b in snap.order} | {b.device_type for b in snap.order}
    for key, value in max_memory.items():
        if isinstance(key, str):
            _check_device(key, names, snap)
        try:
            parse_size(value, what=f"--max-memory {key}")
        except (ValueError, TypeError) as exc:
            raise UsageError(str(exc)) from None


def _check_device(key: str, names: set[str], snap: Any) -> None:
    m = _DEVICE.fullmatch(key)
    if m is not None and m.group("name") in ("cpu", "disk"):
        if m.group("index") not in (None, "0"):
            raise UsageError(
                f"--max-memory {key!r}: {m.group('name')} has no index; write {m.group('name')}=SIZE"
            )
        return
    if m is not None and m.group("name") in names:
        return
    raise UsageError(
        f"--max-memory {key!r} {'is not a backend accelreg knows' if m else 'is not a device'}"
        f"{_device_hint(key, names, snap)}; the backends registered here: "
        f"{', '.join(sorted(names - {'cpu'}))}, cpu and disk (a backend whose plugin is not installed "
        "here is unknown: install it to plan for it)"
    )


def _device_hint(key: str, names: set[str], snap: Any) -> str:
    """`` (did you mean 'npu:0'?)``: a missing colon (``npu0``), another case (``NPU:0``), the name
    Ray gives a backend's devices (``gpu``: cuda, xpu), or a close spelling."""
    text = key.strip().lower()
    m = _DEVICE.fullmatch(text)
    split = re.fullmatch(r"(?P<name>[a-z][a-z0-9_]*?)[ _-]?(?P<index>[0-9]+)", text)
    if split is not None and (m is None or m.group("name") not in names) and split.group("name") in names:
        m = split
    if m is None:
        return ""
    name, index = m.group("name"), m.group("index")
    suffix = f":{int(index)}" if index is not None else ""
    if name in names | {"cpu", "disk"}:
        guesses = [name]
    else:
        guesses = [b.name for b in snap.order if b.spec.ray_resource_name.lower() == name]
        guesses = guesses or difflib.get_close_matches(name, sorted(names), n=3)
    shown = [g if g in ("cpu", "disk") else g + suffix for g in guesses]
    shown = [g for g in shown if g != key]
    return f" (did you mean {' or '.join(repr(g) for g in shown)}?)" if shown else ""


def _check_dtype(dtype: str | None) -> None:
    """Refuse an unknown ``--dtype`` before anything is built (the planner reads it again)."""
    if dtype is None:
        return
    name = dtype.strip().lower().removeprefix("torch.")
    if name not in DTYPE_NAMES:
        raise UsageError(
            f"unknown dtype {dtype!r}{did_you_mean(name, DTYPE_NAMES)}; accepted: {', '.join(DTYPE_NAMES)}"
        )


def _check_no_split(model: Any, classes: list[str] | None) -> None:
    """Refuse a ``--no-split`` class the model has no module of (a typo would go unnoticed)."""
    if not classes:
        return
    present = sorted({type(m).__name__ for m in model.modules()})
    for name in classes:
        if name not in present:
            raise UsageError(
                f"--no-split {name!r}: {type(model).__name__} has no module of that class"
                f"{did_you_mean(name, present)}; its default is "
                f"{', '.join(getattr(model, '_no_split_modules', None) or ()) or '(none)'}"
            )


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


def add_parser(subparsers: Any) -> None:
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
        type=_positive,
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


@dataclass
class _Planned:
    """What ``accelreg plan`` computed: the model built on meta, its plan, and how long each took."""

    model: Any
    built: str
    result: Any
    build_s: float
    plan_s: float
    missing: dict[str, str] = field(default_factory=dict)
    plotted: str | None = None
    plot_error: str | None = None
    explained: list[str] | None = None


class _Refused(Exception):
    """Why ``accelreg plan`` stops before printing a plan: the exit code and the message."""

    def __init__(self, code: int, message: str, violations: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.code, self.violations = code, violations


def cmd_plan(args: argparse.Namespace) -> int:
    """Build MODEL on meta, plan it, draw it if asked, and print the plan (text or JSON)."""
    try:
        planned = _compute(args)
        _draw(args, planned)
    except _Refused as refused:
        return _fail(args, refused.code, str(refused), refused.violations)
    if args.explain:
        planned.explained = explain(planned.result, args.search_limit)
    (_print_json if args.json else _print_text)(args, planned)
    return _plot_failed(planned.plot_error)


def _compute(args: argparse.Namespace) -> _Planned:
    """Check the arguments, build the model and plan it; every refusal is a :class:`_Refused`."""
    try:
        # every flag first, before anything is imported or built (issue 31)
        max_memory = parse_max_memory(args.max_memory) if args.max_memory is not None else None
        if max_memory is not None:
            _check_budgets(max_memory)
        _check_dtype(args.dtype)
        no_split = [c.strip() for c in args.no_split.split(",") if c.strip()] if args.no_split else None
        if args.plot and Path(args.plot).suffix.lower() not in (".png", ".svg"):
            raise UsageError(f"--plot {args.plot!r}: the file name must end in .png or .svg")
        if args.plot and not Path(args.plot).expanduser().resolve().parent.is_dir():
            raise UsageError(f"--plot {args.plot!r}: the folder to write it in does not exist")
        started = time.perf_counter()
        model, built = _build(args)
        build_s = time.perf_counter() - started
        _check_no_split(model, no_split)
        started = time.perf_counter()
        result = plan(
            model,
            max_memory,
            no_split_module_classes=no_split,
            strategy=args.strategy,
            dtype=args.dtype or ("float16" if args.quantization else None),
            quantization=args.quantization,
            search_limit=args.search_limit,
            any_main=args.patch_free,
        )
        plan_s = time.perf_counter() - started
        return _Planned(model, built, result, build_s, plan_s, missing_devices(result.device_map.values()))
    except UsageError as exc:
        raise _Refused(EXIT_USAGE, str(exc)) from exc
    except DeviceMapError as exc:
        raise _Refused(EXIT_FAILED, str(exc), exc.violations) from exc
    except DeviceError as exc:
        raise _Refused(EXIT_FAILED, str(exc)) from exc
    except (ValueError, TypeError) as exc:  # bad sizes, keys or dtype in the arguments
        raise _Refused(EXIT_USAGE, str(exc)) from exc


def _build(args: argparse.Namespace) -> tuple[Any, str]:
    try:
        return build_meta_model(args.model, task=args.task, model_class=args.model_class)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".", 1)[0] not in HF_LIBRARIES:
            raise
        raise _Refused(EXIT_FAILED, str(exc)) from exc  # it names pip install 'accelreg[hf]


def _draw(args: argparse.Namespace, planned: _Planned) -> None:
    """Write ``--plot``; a file that cannot be written is reported after the plan is printed."""
    if not args.plot:
        return
    try:
        planned.plotted = str(_plot(planned.result, args.plot, planned.built))
    except ImportError as exc:
        raise _Refused(EXIT_FAILED, "--plot needs matplotlib (pip install 'accelreg[plot]')") from exc
    except OSError as exc:  # the plan is still good: print it, then say why there is no plot
        planned.plot_error = f"--plot {args.plot!r}: cannot write the file: {exc.strerror or exc}"


def _print_json(args: argparse.Namespace, planned: _Planned) -> None:
    data = planned.result.as_dict()
    if planned.explained is not None:
        data["explain"] = planned.explained
    data.update(
        model=args.model,
        built=planned.built,
        parameters=sum(p.numel() for p in planned.model.parameters()),
        build_seconds=round(planned.build_s, 4),
        plan_seconds=round(planned.plan_s, 4),
        plot=planned.plotted,
        missing_devices=planned.missing,
    )
    if planned.plot_error:
        data["plot_error"] = planned.plot_error
    print(json.dumps(data, indent=2))


def _print_text(args: argparse.Namespace, planned: _Planned) -> None:
    result = planned.result
    dtype_note = result.dtype or "checkpoint dtypes"
    quant = f", {result.quantization}" if result.quantization else ""
    print(
        f"{planned.built}: {format_size(result.total)} in {dtype_note}{quant}; strategy {result.strategy}; "
        f"budgets from {result.budgets.source}"
    )
    print()
    print(table(rows(result), ["place", "used", "budget", "headroom", "share", "layers"]))
    print(_residency_line(result))
    headroom = _headroom_line(result)
    if headroom:
        print(headroom)
    for note in result.notes:
        print(f"note: {note}")
    for line in _missing_lines(planned.missing):
        print(line)
    if planned.explained is not None:
        print()
        print("why:")
        for line in planned.explained:
            print(f"  {line}")
    print()
    print("device_map:")
    width = max((len(k) for k in result.device_map), default=0)
    for key, place in result.device_map.items():
        print(f"  {(key or '(whole model)').ljust(width)}  {place}")
    print()
    print(f"built on meta in {planned.build_s:.2f} s; planned in {1000 * planned.plan_s:.1f} ms")
    if planned.plotted:
        print(f"plot written to {planned.plotted}")


def _residency_line(result: Any) -> str:
    share = (
        f"{format_size(result.resident)} of {format_size(result.total)} ({100 * result.resident_share:.1f} %)"
    )
    line = f"on accelerators: {share}"
    if result.main_device is not None and result.any_main:
        used = ", ".join(u.place for u in result.places if u.headroom and u.place not in ("cpu", "disk"))
        line += f"; each of {used} keeps the headroom to run the offloaded layers (stock dispatch picks one)"
    elif result.main_device is not None:
        line += f"; main device {result.main_device} runs the offloaded layers"
    if result.optimal is not None:
        line += "; no map keeps more" if result.optimal else "; the search stopped at its limit"
    return line


def _headroom_line(result: Any) -> str:
    reserved = {usage.place for usage in result.places if usage.headroom}
    why = []
    if reserved - {"cpu"}:
        where = "on each accelerator used" if result.any_main else "on the main device"
        why.append(f"{where} to run the largest offloaded layer")
    if "cpu" in reserved:
        why.append("on the cpu to stage the largest disk-offloaded layer")
    return f"headroom: space reserved (not free) {'; '.join(why)}" if why else ""


def _missing_lines(missing: dict[str, str]) -> list[str]:
    """One note per reason for the map's devices this process does not have."""
    by_reason: dict[str, list[str]] = {}
    for place, why in missing.items():
        by_reason.setdefault(why, []).append(place)
    return [
        f"note: this process has no {', '.join(places)} ({why}): the map is for a machine that has "
        f"{'them' if len(places) > 1 else 'it'}"
        for why, places in by_reason.items()
    ]


def _plot_failed(error: str | None) -> int:
    if error is None:
        return EXIT_OK
    sys.stdout.flush()  # the plan first, then the error
    print(f"accelreg plan: {error}", file=sys.stderr)
    return EXIT_FAILED


def _plot(result: Any, path: str, title: str) -> Path:
    from ..planner.plot import plot_plan  # matplotlib: only when a plot is asked for

    return plot_plan(result, path, title=title)
