"""Helpers shared by the planner tests (no tests here): meta models, budgets, an independent
brute-force oracle (feasibility and the most accelerator-resident map), and translation of
upstream (int-keyed) maps and budgets."""

from __future__ import annotations

import functools
import itertools
import logging
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

# -- transformers models on meta -----------------------------------------------------------
LAYER_KEYS = (
    "num_hidden_layers",
    "num_layers",
    "n_layer",
    "n_layers",
    "encoder_layers",
    "decoder_layers",
    "num_decoder_layers",
    "num_encoder_layers",
    "text_layers",
    "vision_layers",
    "num_blocks",
)


def quiet() -> None:
    """Silence transformers' and accelerate's chatter (warnings about absent devices, ...)."""
    import transformers

    transformers.logging.set_verbosity_error()
    for name in ("accelerate", "accelerate.utils.modeling", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="transformers")
    warnings.filterwarnings("ignore", module="accelerate")


def shrink(config: Any, seen: set[int] | None = None) -> None:
    """At most 2 layers in ``config`` and its sub-configs (building on meta costs per module)."""
    import transformers

    seen = set() if seen is None else seen
    if id(config) in seen:
        return
    seen.add(id(config))
    for key in LAYER_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 2:
            try:
                setattr(config, key, 2)
            except Exception:  # noqa: BLE001 - a validated config may refuse; keep its value
                pass
    for value in list(vars(config).values()):
        if isinstance(value, transformers.PretrainedConfig):
            shrink(value, seen)


def build_class(name: str, *, small: bool = True, **overrides: Any) -> nn.Module:
    """Model class ``name`` of transformers on meta from its default config (shrunk when that
    builds, else as is)."""
    import transformers

    quiet()
    cls = getattr(transformers, name)
    error: Exception | None = None
    for attempt in (True, False) if small else (False,):
        try:
            config = cls.config_class()
            if name == "ReformerModelWithLMHead":  # a causal LM; the masked-LM class wants the default
                config.is_decoder = True
            for key, value in overrides.items():
                setattr(config, key, value)
            if attempt:
                shrink(config)
            with torch.device("meta"):
                return cls._from_config(config)
        except Exception as exc:  # noqa: BLE001 - reported by the caller
            error = exc
    assert error is not None
    raise error


@functools.cache
def model_type(kind: str, **overrides: Any) -> nn.Module:
    """A transformers model built on meta from ``AutoConfig.for_model(kind)`` (cached)."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM

    quiet()
    config = AutoConfig.for_model(kind)
    for key, value in overrides.items():
        setattr(config, key, value)
    for auto in (AutoModelForSeq2SeqLM, AutoModelForCausalLM, AutoModel):
        try:
            with torch.device("meta"):
                return auto.from_config(config)
        except ValueError:
            continue
    raise AssertionError(f"cannot build {kind}")


def cached_class(name: str) -> nn.Module:
    return _cached_class(name)


@functools.cache
def _cached_class(name: str) -> nn.Module:
    return build_class(name)


def total_bytes(model: nn.Module, dtype: Any = None) -> int:
    from accelreg.planner.plan import analyze

    return analyze(model, dtype=dtype)[0].total


# -- upstream interop -----------------------------------------------------------------------
def npu_budgets(int_budgets: Mapping[Any, int], backend: str = "npu") -> dict[Any, int]:
    """Upstream's int-keyed budgets as fully qualified ones: ``{0: x}`` -> ``{"npu:0": x}``."""
    return {(f"{backend}:{k}" if isinstance(k, int) else k): v for k, v in int_budgets.items()}


def npu_map(device_map: Mapping[str, Any], backend: str = "npu") -> dict[str, Any]:
    """An upstream map with int values as fully qualified places."""
    return {k: (f"{backend}:{v}" if isinstance(v, int) else v) for k, v in device_map.items()}


def violations(
    model: nn.Module, device_map: Mapping[str, Any], budgets: Mapping[Any, Any] | None = None, **kw: Any
) -> tuple[str, ...]:
    import accelreg

    try:
        accelreg.check_device_map(model, device_map, budgets, **kw)
    except accelreg.DeviceMapError as exc:
        return exc.violations
    return ()


# -- an independent oracle for small models --------------------------------------------------
def atoms(
    model: nn.Module, no_split: frozenset[str]
) -> list[tuple[list[str], list[tuple[str, torch.Tensor]]]]:
    """The placeable pieces of ``model`` in pre-order: ``(map keys, [(name, tensor), ...])``.

    A no-split module is one piece (its path); any other module's own tensors are one piece
    (a key per tensor). Written independently of accelreg.planner.layout.
    """
    out: list[tuple[list[str], list[tuple[str, torch.Tensor]]]] = []

    def own(module: nn.Module, prefix: str) -> list[tuple[str, torch.Tensor]]:
        items = [(prefix + n, p) for n, p in module._parameters.items() if p is not None]
        items += [(prefix + n, b) for n, b in module._buffers.items() if b is not None]
        return items

    def subtree(module: nn.Module, prefix: str) -> list[tuple[str, torch.Tensor]]:
        items = own(module, prefix)
        for n, child in module._modules.items():
            if child is not None:
                items += subtree(child, prefix + n + ".")
        return items

    def visit(module: nn.Module, path: str) -> None:
        prefix = path + "." if path else ""
        if type(module).__name__ in no_split:
            items = subtree(module, prefix)
            if items:
                out.append(([path], items))
            return
        items = own(module, prefix)
        if items:
            out.append(([name for name, _ in items], items))
        for n, child in module._modules.items():
            if child is not None:
                visit(child, prefix + n)

    visit(model, "")
    return out


def brute_force(
    model: nn.Module,
    budgets: Mapping[str, int],
    no_split: frozenset[str] = frozenset(),
    ties: list[list[str]] = (),  # type: ignore[assignment]
    limit: int = 200_000,
) -> dict[str, str] | None:
    """A valid map found by trying every assignment of pieces to places and every main device,
    or ``None``. The map lists its main device first (the rule the planner and accelreg's
    dispatch wrapper follow)."""
    return next((out for out, _ in _valid_maps(model, budgets, no_split, ties, limit)), None)


def most_resident(
    model: nn.Module,
    budgets: Mapping[str, int],
    no_split: frozenset[str] = frozenset(),
    ties: list[list[str]] = (),  # type: ignore[assignment]
    limit: int = 200_000,
) -> tuple[int, dict[str, str]] | None:
    """``(bytes on accelerators, map)`` of a valid map that keeps the most bytes on
    accelerators, over every assignment and main device; ``None`` when no map is valid."""
    best = None
    for out, held in _valid_maps(model, budgets, no_split, ties, limit):
        if best is None or held > best[0]:
            best = (held, out)
    return best


def _valid_maps(model, budgets, no_split, ties, limit):
    """Every valid map with the bytes it keeps on accelerators, as ``(map, bytes)``."""
    pieces = atoms(model, no_split)
    places = list(budgets)
    accelerators = [p for p in places if p not in ("cpu", "disk")]
    names_of = [[n for n, _ in items] for _, items in pieces]
    where: dict[str, int] = {n: i for i, names in enumerate(names_of) for n in names}
    # pieces that must share a place: shared tensor objects, and the caller's ties
    parent = list(range(len(pieces)))

    def find(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    by_id: dict[int, int] = {}
    for i, (_, items) in enumerate(pieces):
        for _, t in items:
            j = by_id.setdefault(id(t), i)
            parent[find(i)] = find(j)
    for group in ties:
        for a, b in itertools.pairwise(group):
            parent[find(where[a])] = find(where[b])
    groups = sorted({find(i) for i in range(len(pieces))})
    tie_alias: dict[int, int] = {}
    named = {n: t for _, items in pieces for n, t in items}
    for group in ties:
        first = named[group[0]]
        for n in group[1:]:
            if named[n].numel() == first.numel():
                tie_alias[id(named[n])] = id(first)

    def storage(t: torch.Tensor) -> int:
        return tie_alias.get(id(t), id(t))

    def nbytes(t: torch.Tensor) -> int:
        return t.numel() * t.element_size()

    def piece_size(i: int) -> int:
        seen: dict[int, int] = {}
        for _, t in pieces[i][1]:
            seen[storage(t)] = nbytes(t)
        return sum(seen.values())

    tried = 0
    for choice in itertools.product(range(len(places)), repeat=len(groups)):
        tried += 1
        if tried > limit:
            raise RuntimeError("brute force too large")
        place_of_group = dict(zip(groups, choice, strict=True))
        assign = [places[place_of_group[find(i)]] for i in range(len(pieces))]
        main = valid(pieces, assign, budgets, accelerators, storage, nbytes, piece_size)
        if main is False:
            continue
        out: dict[str, str] = {}
        for i, (keys, _) in enumerate(pieces):
            for k in keys:
                out[k] = assign[i]
        if isinstance(main, str):  # the main device's first key leads the map
            lead = next(k for k, v in out.items() if v == main)
            out = {lead: main, **{k: v for k, v in out.items() if k != lead}}
        yield out, resident_bytes(pieces, assign, accelerators, storage, nbytes)


def resident_bytes(pieces, assign, accelerators, storage, nbytes) -> int:
    held: dict[tuple[str, int], int] = {}
    for i, (_, items) in enumerate(pieces):
        if assign[i] in accelerators:
            for _, t in items:
                held[(assign[i], storage(t))] = nbytes(t)
    return sum(held.values())


def valid(pieces, assign, budgets, accelerators, storage, nbytes, piece_size, main=None) -> str | bool:
    """Whether ``assign`` obeys the budgets with offload headroom on the main device: ``main``
    when given, else any accelerator that holds something. Returns the main device that works
    (``True`` when none is needed), or ``False``."""
    loads: dict[str, dict[int, int]] = {p: {} for p in budgets}
    for i, (_, items) in enumerate(pieces):
        for _, t in items:
            loads[assign[i]][storage(t)] = nbytes(t)
    used = [p for p in accelerators if loads[p]]
    off = max((piece_size(i) for i in range(len(pieces)) if assign[i] in ("cpu", "disk")), default=0)
    disk = max((piece_size(i) for i in range(len(pieces)) if assign[i] == "disk"), default=0)
    need = {place: sum(loads[place].values()) for place in budgets}
    if "cpu" in need:
        need["cpu"] += disk
    if any(need[p] > budgets[p] for p in budgets):
        return False
    if not off or not used:
        return True
    candidates = [main] if main is not None else used
    return next((m for m in candidates if m in used and need[m] + off <= budgets[m]), False)


def oracle_valid(
    model: nn.Module, device_map: Mapping[str, str], budgets: Mapping[str, int], no_split=frozenset(), ties=()
) -> bool:
    """Whether the oracle's rules accept ``device_map`` (which must be piece-aligned)."""
    pieces = atoms(model, no_split)
    tensor_place: dict[str, str] = {}
    for key, place in device_map.items():
        for _, items in pieces:
            for n, _ in items:
                if key == "" or n == key or n.startswith(key + "."):
                    tensor_place[n] = place
    assign = []
    for _, items in pieces:
        got = {tensor_place.get(n) for n, _ in items}
        if len(got) != 1 or None in got:
            return False
        assign.append(got.pop())
    by_id: dict[int, str] = {}
    for i, (_, items) in enumerate(pieces):
        for _, t in items:
            if by_id.setdefault(id(t), assign[i]) != assign[i]:
                return False
    named = {n: (t, assign[i]) for i, (_, items) in enumerate(pieces) for n, t in items}
    for group in ties:
        if len({named[n][1] for n in group}) > 1:
            return False
    alias = {}
    for group in ties:
        first = named[group[0]][0]
        for n in group[1:]:
            if named[n][0].numel() == first.numel():
                alias[id(named[n][0])] = id(first)

    def storage(t):
        return alias.get(id(t), id(t))

    def nbytes(t):
        return t.numel() * t.element_size()

    def piece_size(i):
        seen = {}
        for _, t in pieces[i][1]:
            seen[storage(t)] = nbytes(t)
        return sum(seen.values())

    accelerators = [p for p in budgets if p not in ("cpu", "disk")]
    main = next((v for v in device_map.values() if v not in ("cpu", "disk")), None)  # first in the map
    return valid(pieces, assign, budgets, accelerators, storage, nbytes, piece_size, main) is not False
