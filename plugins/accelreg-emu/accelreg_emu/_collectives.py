"""Collectives on emulated devices: a ``torch.distributed`` backend registered through torch's
public ``Backend.register_backend``.

Each process group wraps a gloo process group made from the same store. An operation copies
its device tensors to the host, runs gloo's operation there, waits for it and copies the
results back into the device tensors (host tensors go to gloo as they are), so a finished
operation returns an already-completed work. Emulated devices are host memory anyway: the
copies cost what gloo's own staging would. As a device runtime's collectives do, they write
their outputs outside autograd (DeepSpeed 0.18's ZeRO-1/2 gathers into buffers that require
grad).

The backend is registered under the collective name of the runtime being emulated (``hccl``
for ``npu``/``hpu``, ``cncl`` for ``mlu``, ...; ``emuccl`` under ``emu``), which the plugin
declares as its ``dist_backend``, and it is torch's default backend for the device type.
Supported: all_reduce (and coalesced), all_gather (list, into one tensor, coalesced),
reduce_scatter (list, from one tensor, coalesced), broadcast, barrier, all_to_all_single,
send and recv.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

__all__ = ["register"]

_registered: dict[str, str] = {}


def _done(result: Any = None) -> Any:
    from torch._C._distributed_c10d import _create_work_from_future

    future: torch.futures.Future[Any] = torch.futures.Future()
    future.set_result(result)
    return _create_work_from_future(future)


def _host(t: torch.Tensor) -> torch.Tensor:
    return t if t.device.type == "cpu" else t.cpu()


@torch.no_grad()
def _back(targets: Sequence[torch.Tensor], hosts: Sequence[torch.Tensor]) -> None:
    for target, host in zip(targets, hosts, strict=True):
        if target is not host:
            target.copy_(host)


def _reduce_options(opts: Any) -> Any:
    out = dist.AllreduceOptions()
    out.reduceOp = opts.reduceOp
    return out


class EmulatedProcessGroup(dist.ProcessGroup):
    """A process group for tensors on emulated devices (and host tensors), over gloo.

    gloo is also registered as the group's backend *object* for the device type and the cpu:
    torch asks a group for its backend per device where a device is bound
    (``init_process_group(device_id=...)``, as Lightning 2.6 and accelerate pass it;
    ``new_group`` splitting from a bound group), and a group without one fails there with "No
    backend type associated with device type npu". The operations themselves still go
    through this class's methods.
    """

    def __init__(
        self, name: str, store: Any, rank: int, size: int, timeout: timedelta, device_type: str = "cpu"
    ) -> None:
        super().__init__(rank, size)
        self._name = name
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        for device in dict.fromkeys((device_type, "cpu")):
            self._register_backend(torch.device(device), dist.ProcessGroup.BackendType.CUSTOM, self._gloo)

    def getBackendName(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return f"EmulatedProcessGroup({self._name}, rank={self.rank()}, size={self.size()})"

    # -- reductions -------------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.AllreduceOptions()
        hosts = [_host(t) for t in tensors]
        self._gloo.allreduce(hosts, _reduce_options(opts)).wait()
        _back(tensors, hosts)
        return _done(tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        for t in tensors:
            self.allreduce([t], opts)
        return _done(tensors)

    def reduce_scatter(
        self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None
    ) -> Any:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        for output, chunks in zip(outputs, inputs, strict=True):
            self._reduce_scatter_flat(output, torch.cat([c.reshape(-1) for c in chunks]), opts)
        return _done(outputs)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        self._reduce_scatter_flat(output, input.reshape(-1), opts)
        return _done(output)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Any:
        return self._pairwise(self.reduce_scatter_single, outputs, inputs, opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    @torch.no_grad()
    def _reduce_scatter_flat(self, output: torch.Tensor, flat: torch.Tensor, opts: Any) -> None:
        # all-reduce the whole input, keep this rank's chunk: twice gloo's traffic, exact sums
        host = flat.to("cpu", copy=True)
        self._gloo.allreduce([host], _reduce_options(opts)).wait()
        n = output.numel()
        output.copy_(host[self.rank() * n : (self.rank() + 1) * n].view_as(output))

    # -- gathers ----------------------------------------------------------------------------
    def allgather(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None
    ) -> Any:
        opts = opts if opts is not None else _c10d.AllgatherOptions()  # not in torch.distributed's namespace
        host_outputs = [[_host(t) for t in group] for group in outputs]
        self._gloo.allgather(host_outputs, [_host(t) for t in inputs], opts).wait()
        for group, hosts in zip(outputs, host_outputs, strict=True):
            _back(group, hosts)
        return _done(outputs)

    @torch.no_grad()
    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        target = output if output.is_contiguous() else output.contiguous()
        chunks = list(torch.chunk(target.view(-1), self.size()))
        self.allgather([chunks], [input.reshape(-1)], opts)
        if target is not output:
            output.copy_(target)
        return _done(output)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Any:
        return self._pairwise(self.all_gather_single, outputs, inputs, opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    @staticmethod
    def _pairwise(single: Any, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any) -> Any:
        """A coalesced operation as its single-tensor form, one pair at a time."""
        for output, input in zip(outputs, inputs, strict=True):
            single(output, input, opts)
        return _done(outputs)

    # -- the rest ---------------------------------------------------------------------------
    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.BroadcastOptions()
        hosts = [_host(t) for t in tensors]
        self._gloo.broadcast(hosts, opts).wait()
        _back(tensors, hosts)
        return _done(tensors)

    def barrier(self, opts: Any = None) -> Any:
        self._gloo.barrier(opts if opts is not None else dist.BarrierOptions()).wait()
        return _done()

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_splits: list[int],
        input_splits: list[int],
        opts: Any = None,
    ) -> Any:
        opts = opts if opts is not None else dist.AllToAllOptions()
        host_out = _host(output)
        self._gloo.alltoall_base(host_out, _host(input), output_splits, input_splits, opts).wait()
        _back([output], [host_out])
        return _done(output)

    alltoall_base = all_to_all_single

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Any:
        self._gloo.send([_host(t) for t in tensors], dst, tag).wait()
        return _done()

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Any:
        hosts = [_host(t) for t in tensors]
        self._gloo.recv(hosts, src, tag).wait()
        _back(tensors, hosts)
        return _done(tensors)


def register(collective: str, device_type: str) -> str:
    """Register ``collective`` with ``torch.distributed`` for ``device_type`` (and cpu); idempotent.

    Returns the name. Afterwards ``init_process_group(collective)`` works, also with
    ``device_id=<a device_type device>``, and so does ``init_process_group()`` on a process
    whose tensors live on ``device_type``.
    """
    if _registered.get(collective) == device_type:
        return collective
    if not dist.is_available():
        raise RuntimeError("accelreg-emu: this torch build has no torch.distributed")

    def create(store: Any, rank: int, size: int, timeout: timedelta) -> EmulatedProcessGroup:
        return EmulatedProcessGroup(collective, store, rank, size, timeout, device_type)

    dist.Backend.register_backend(collective, create, devices=[device_type, "cpu"])
    # register_backend keeps an existing default for a device type; this one is the runtime's
    dist.Backend.default_device_backend_map[device_type] = collective
    _registered[collective] = device_type
    return collective
