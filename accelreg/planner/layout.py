"""The model as the planner sees it: tensors in forward order, modules, atoms and units.

One walk over the module tree (registration order, which the planner takes as forward order)
records every parameter and buffer *occurrence* under every name it has (a module registered
twice, or a tied weight, has several names), its size in bytes and the storage it lives in.

* An **atom** is the smallest thing a device map can place: the whole subtree of a no-split
  module, or the module's own (direct) parameters and buffers, which its ``forward`` uses
  together. Atoms are contiguous ranges of the tensor list.
* A **unit** is what must sit on one device: atoms joined by union-find whenever they share a
  storage (tied by identity: on ``meta`` a tied weight is one ``Parameter`` object), are tied
  by the model's declared ties (transformers' ``all_tied_weights_keys``) or by the caller's
  ``tied_parameters``. A unit's size counts each storage once.

Everything here is linear in the number of modules and tensors.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from ..errors import DeviceMapError

__all__ = ["Layout", "declared_ties"]


class Layout:
    """Tensors, modules, atoms and units of one model (see the module docstring).

    Tensor ``t`` (an index) has ``names[t]``, ``nbytes[t]``, ``storage[t]`` (a canonical storage
    index), ``required[t]`` (a parameter or persistent buffer: a device map must cover it) and
    ``owner[t]`` (module index). Module ``m`` (pre-order index) has ``paths[m]``, ``modules[m]``,
    and tensor ranges ``[start[m], own_end[m])`` (its own tensors) and ``[start[m], end[m])``
    (its subtree); its subtree's modules are ``m .. after[m] - 1``.
    """

    def __init__(self, model: Any, *, no_split: Iterable[str] | None, dtype: Any) -> None:
        self.model = model
        self.no_split = frozenset(no_split or ())
        self.dtype = dtype
        self.names: list[str] = []
        self.nbytes: list[int] = []
        self.keys: list[Any] = []
        self.required: list[bool] = []
        self.is_param: list[bool] = []
        self.owner: list[int] = []
        self.tensors: list[Any] = []
        self.paths: list[str] = []
        self.modules: list[Any] = []
        self.parent: list[int] = []
        self.start: list[int] = []
        self.own_end: list[int] = []
        self.end: list[int] = []
        self.after: list[int] = []
        self.blocks: list[bool] = []
        #: tensor index -> (quant method, PlacementRule) for weights that will be quantized
        self.quantized: dict[int, tuple[str, Any]] = {}
        self._walk(model)
        self._tensor_index: dict[str, int] | None = None
        self._module_index: dict[str, int] | None = None

    # -- the walk ---------------------------------------------------------------------------
    def _walk(self, model: Any) -> None:
        import torch

        names, nbytes, keys, required, owner, tensors, is_param = (
            self.names,
            self.nbytes,
            self.keys,
            self.required,
            self.owner,
            self.tensors,
            self.is_param,
        )
        paths, modules, parent, start, own_end, end, after = (
            self.paths,
            self.modules,
            self.parent,
            self.start,
            self.own_end,
            self.end,
            self.after,
        )
        dsize = torch.empty((), dtype=self.dtype).element_size() if self.dtype is not None else 0
        ancestors: set[int] = set()

        def record(name: str, t: Any) -> None:
            names.append(name)
            if dsize and t.is_floating_point():
                numel = t.numel()
                nbytes.append(numel * dsize)
            else:
                size = t.nbytes
                nbytes.append(size)
                numel = size
            keys.append(id(t) if t.is_meta or not numel else (t.device, t.untyped_storage().data_ptr()))
            tensors.append(t)

        def visit(path: str, module: Any, up: int) -> None:
            m = len(paths)
            paths.append(path)
            modules.append(module)
            parent.append(up)
            start.append(len(names))
            prefix = path + "." if path else ""
            for n, t in module._parameters.items():
                if t is not None:
                    record(prefix + n, t)
                    is_param.append(True)
                    required.append(True)
                    owner.append(m)
            buffers = module._buffers
            if buffers:
                transient = module._non_persistent_buffers_set
                for n, t in buffers.items():
                    if t is not None:
                        record(prefix + n, t)
                        is_param.append(False)
                        required.append(n not in transient)
                        owner.append(m)
            own_end.append(len(names))
            end.append(0)
            after.append(0)
            children = module._modules
            if children:
                ancestors.add(id(module))
                for n, child in children.items():
                    if child is None:
                        continue
                    if id(child) in ancestors:
                        raise ValueError(
                            f"module {prefix + n!r} contains itself; cannot plan a cyclic module tree"
                        )
                    visit(prefix + n, child, m)
                ancestors.discard(id(module))
            end[m] = len(names)
            after[m] = len(paths)

        visit("", model, -1)
        kinds: dict[type, bool] = {}
        no_split = self.no_split
        blocks = self.blocks
        for module in modules:
            cls = type(module)
            flag = kinds.get(cls)
            if flag is None:
                flag = kinds[cls] = bool(no_split) and (
                    cls.__name__ in no_split or f"{cls.__module__}.{cls.__qualname__}" in no_split
                )
            blocks.append(flag)

    # -- lookups ----------------------------------------------------------------------------
    @property
    def tensor_index(self) -> dict[str, int]:
        """Tensor name -> index (every name of every occurrence)."""
        if self._tensor_index is None:
            self._tensor_index = {n: i for i, n in enumerate(self.names)}
        return self._tensor_index

    @property
    def module_index(self) -> dict[str, int]:
        """Module path -> pre-order index (``""`` is the model)."""
        if self._module_index is None:
            index: dict[str, int] = {}
            for i, p in enumerate(self.paths):
                index.setdefault(p, i)
            self._module_index = index
        return self._module_index

    def class_name(self, m: int) -> str:
        return type(self.modules[m]).__name__

    def keep_fp32(self, patterns: Sequence[str]) -> None:
        """Size floating tensors whose name matches one of ``patterns`` as float32.

        transformers keeps ``_keep_in_fp32_modules`` in float32 when loading in float16 (and
        ``_keep_in_fp32_modules_strict`` in float16 or bfloat16), matching each pattern as a
        regular-expression *search* in the parameter name; this does the same.
        """
        if not patterns:
            return
        regex = re.compile("|".join(f"(?:{p.replace('*', '.*')})" for p in patterns))
        for t, name in enumerate(self.names):
            tensor = self.tensors[t]
            if tensor.is_floating_point() and regex.search(name):
                self.nbytes[t] = tensor.numel() * 4

    # -- atoms and units --------------------------------------------------------------------
    def build(
        self, ties: Iterable[Sequence[str]] = (), *, strict_names: Sequence[Sequence[str]] = ()
    ) -> None:
        """Form atoms and units. ``ties`` are declared groups of tensor names (unknown names are
        ignored); ``strict_names`` are the caller's groups (an unknown name is an error)."""
        self._form_atoms()
        joined = _Sets(len(self.atom_start))  # atoms that must share a device
        storage, storage_size = self._find_storages(joined)
        self._tie(joined, storage, storage_size, ties, strict_names)
        self._form_units(joined)
        self._size_units()
        self._size_atoms()
        self._gather_units()
        self._offload_rights()

    def _form_atoms(self) -> None:
        """Cut the tensor list into atoms: a no-split block's whole subtree, or a module's own tensors."""
        start, own_end, end, after, blocks = self.start, self.own_end, self.end, self.after, self.blocks
        atom_start: list[int] = []
        atom_end: list[int] = []
        atom_module: list[int] = []
        atom_block: list[bool] = []
        tensor_atom = [0] * len(self.names)
        m, n_modules = 0, len(self.paths)
        while m < n_modules:
            # a no-split block is one atom of all its tensors (then skip its submodules);
            # any other module contributes an atom of its own direct tensors
            block = blocks[m]
            s, e = start[m], end[m] if block else own_end[m]
            if e > s:
                a = len(atom_start)
                atom_start.append(s)
                atom_end.append(e)
                atom_module.append(m)
                atom_block.append(block)
                tensor_atom[s:e] = [a] * (e - s)
            m = after[m] if block else m + 1
        self.atom_start, self.atom_end, self.atom_module, self.atom_block = (
            atom_start,
            atom_end,
            atom_module,
            atom_block,
        )
        self.tensor_atom = tensor_atom

    def _find_storages(self, joined: _Sets) -> tuple[list[int], list[int]]:
        """Give each distinct storage an index (and its largest size); join atoms sharing one.
        Returns each tensor's storage, and each storage's size."""
        tensor_atom, nbytes = self.tensor_atom, self.nbytes
        first: dict[Any, int] = {}
        storage = [0] * len(self.names)
        storage_size: list[int] = []
        storage_first: list[int] = []
        for t, key in enumerate(self.keys):
            s = first.get(key)
            if s is None:
                s = first[key] = len(storage_size)
                storage_size.append(nbytes[t])
                storage_first.append(t)
            else:
                if nbytes[t] > storage_size[s]:
                    storage_size[s] = nbytes[t]
                joined.union(tensor_atom[t], tensor_atom[storage_first[s]])
            storage[t] = s
        return storage, storage_size

    def _tie(
        self,
        joined: _Sets,
        storage: list[int],
        storage_size: list[int],
        ties: Iterable[Sequence[str]],
        strict_names: Sequence[Sequence[str]],
    ) -> None:
        """Join the atoms of tied tensors; tied tensors of one size become one storage (otherwise
        both are counted, which can only overestimate). Sets ``storage`` and ``storage_size``."""
        tensor_atom = self.tensor_atom
        alias = _Sets(len(storage_size))  # storages that are one once tied
        index = self.tensor_index if (ties or strict_names) else {}
        unknown: list[str] = []
        for groups, strict in ((ties, False), (strict_names, True)):
            for group in groups:
                members = []
                for name in group:
                    t = index.get(name)
                    if t is None:
                        if strict:
                            unknown.append(name)
                        continue
                    members.append(t)
                for t in members[1:]:
                    joined.union(tensor_atom[t], tensor_atom[members[0]])
                    a, b = alias.find(storage[t]), alias.find(storage[members[0]])
                    if a != b and storage_size[a] == storage_size[b]:
                        alias.union(a, b)
        if unknown:
            raise _unknown_tied(unknown)
        self.storage = [alias.find(s) for s in storage]
        self.storage_size = storage_size

    def _form_units(self, joined: _Sets) -> None:
        """Number the units (sets of joined atoms) in forward order of their first atom."""
        find = joined.find
        unit_of_root: dict[int, int] = {}
        atom_unit = [0] * len(self.atom_start)
        unit_first: list[int] = []
        for a in range(len(atom_unit)):
            r = find(a)
            u = unit_of_root.get(r)
            if u is None:
                u = unit_of_root[r] = len(unit_first)
                unit_first.append(a)
            atom_unit[a] = u
        self.atom_unit, self.unit_first = atom_unit, unit_first

    def _size_units(self) -> None:
        """A unit's bytes: the storages its tensors use, each counted once in the whole model."""
        atom_unit, tensor_atom = self.atom_unit, self.tensor_atom
        storage_of, storage_size = self.storage, self.storage_size
        unit_size = [0] * len(self.unit_first)
        counted = [False] * len(storage_size)
        for t in range(len(self.names)):
            s = storage_of[t]
            if not counted[s]:
                counted[s] = True
                unit_size[atom_unit[tensor_atom[t]]] += storage_size[s]
        self.unit_size = unit_size

    def _size_atoms(self) -> None:
        """An atom's bytes (a "layer" for offload headroom): the storages its tensors use, once each."""
        atom_start, atom_end = self.atom_start, self.atom_end
        storage_of, storage_size = self.storage, self.storage_size
        n_atoms = len(atom_start)
        atom_size = [0] * n_atoms
        seen = [-1] * len(storage_size)
        for a in range(n_atoms):
            total = 0
            for t in range(atom_start[a], atom_end[a]):
                s = storage_of[t]
                if seen[s] != a:
                    seen[s] = a
                    total += storage_size[s]
            atom_size[a] = total
        self.atom_size = atom_size

    def _gather_units(self) -> None:
        """Each unit's atoms, its largest atom (its layer) and whether it holds a no-split block."""
        atom_unit, atom_size, atom_block = self.atom_unit, self.atom_size, self.atom_block
        n_units = len(self.unit_first)
        unit_layer = [0] * n_units
        unit_block = [False] * n_units
        unit_atoms: list[list[int]] = [[] for _ in range(n_units)]
        for a in range(len(atom_unit)):
            u = atom_unit[a]
            unit_atoms[u].append(a)
            if atom_size[a] > unit_layer[u]:
                unit_layer[u] = atom_size[a]
            if atom_block[a]:
                unit_block[u] = True
        self.unit_layer, self.unit_block, self.unit_atoms = unit_layer, unit_block, unit_atoms

    def _offload_rights(self) -> None:
        """Where a unit may go when offloaded: every quantized weight in it must allow it."""
        atom_unit, tensor_atom = self.atom_unit, self.tensor_atom
        n_units = len(self.unit_first)
        unit_cpu_ok = [True] * n_units
        unit_disk_ok = [True] * n_units
        for t, (_, rule) in self.quantized.items():
            u = atom_unit[tensor_atom[t]]
            offload = rule.offload
            if "cpu" not in offload:
                unit_cpu_ok[u] = False
            if "disk" not in offload:
                unit_disk_ok[u] = False
        self.unit_cpu_ok, self.unit_disk_ok = unit_cpu_ok, unit_disk_ok

    # -- descriptions -----------------------------------------------------------------------
    def atom_name(self, a: int) -> str:
        """A readable name for atom ``a``: the module path, or its own tensors' names."""
        m = self.atom_module[a]
        if self.atom_block[a] or self.own_end[m] == self.end[m]:  # a block, or a leaf module
            return self.paths[m] or "(model)"
        names = self.names[self.atom_start[a] : self.atom_end[a]]
        return names[0] if len(names) == 1 else f"{self.paths[m] or '(model)'} (own tensors)"

    def unit_name(self, u: int, limit: int = 4) -> str:
        """``"transformer.wte + lm_head"``: the atoms of unit ``u``."""
        atoms = self.unit_atoms[u]
        shown = " + ".join(self.atom_name(a) for a in atoms[:limit])
        return shown + (f" + {len(atoms) - limit} more" if len(atoms) > limit else "")

    @property
    def total(self) -> int:
        """Bytes of the whole model, each storage once."""
        return sum(self.unit_size)


class _Sets:
    """Disjoint sets of ``0..n-1`` (union-find); a set's root is its smallest member."""

    __slots__ = ("up",)

    def __init__(self, n: int) -> None:
        """Each of ``0..n-1`` in a set of its own."""
        self.up = list(range(n))

    def find(self, a: int) -> int:
        """The root of ``a``'s set (compressing the path to it)."""
        up = self.up
        root = a
        while up[root] != root:
            root = up[root]
        while up[a] != root:
            up[a], a = root, up[a]
        return root

    def union(self, a: int, b: int) -> None:
        """Merge the sets of ``a`` and ``b``."""
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            if ra < rb:
                self.up[rb] = ra
            else:
                self.up[ra] = rb


def _unknown_tied(unknown: list[str]) -> DeviceMapError:
    """The error for names in ``tied_parameters`` that the model does not have."""
    shown = ", ".join(repr(n) for n in unknown[:5]) + (
        f" (and {len(unknown) - 5} more)" if len(unknown) > 5 else ""
    )
    return DeviceMapError(
        f"tied_parameters names {len(unknown)} tensor(s) the model does not have: {shown}",
        [f"unknown tensor in tied_parameters: {n!r}" for n in unknown],
    )


def declared_ties(model: Any) -> list[tuple[str, str]]:
    """``(target, source)`` pairs the model declares tied (transformers 5: ``all_tied_weights_keys``,
    filled by ``post_init`` from ``get_expanded_tied_weights_keys``; empty when the config says not
    to tie). Such names are tied at load time even when the meta model's tensors are distinct."""
    keys = getattr(model, "all_tied_weights_keys", None)
    if keys is None:
        expand = getattr(model, "get_expanded_tied_weights_keys", None)
        if callable(expand):
            try:
                keys = expand(all_submodels=True)
            except Exception:  # noqa: BLE001 - a model's own helper failing means "no declared ties"
                keys = None
    if keys is None:
        raw = getattr(model, "_tied_weights_keys", None)
        keys = raw if isinstance(raw, dict) else None
    if not isinstance(keys, dict):
        return []
    return [(str(k), str(v)) for k, v in keys.items()]
