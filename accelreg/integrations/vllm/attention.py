"""Paged attention in torch operations, for vLLM on a backend vLLM has no kernel for.

vLLM's attention backends are kernels for one device family each (FlashAttention and FlashInfer
for CUDA, its C++ kernels for the CPU, ...). The registry platform
(:mod:`.vllm_platform`) has none for a backend vLLM does not know, so it uses this backend:
the same paged KV cache (blocks of ``block_size`` tokens, a block table per request, a slot per
token), written with ``index_put_`` and read with ``torch.nn.functional.scaled_dot_product_attention``,
one request at a time. It runs on any device torch can run those operators on; it is not fast,
and it is exact: the greedy tokens equal vLLM's own CPU kernels' on the same model
(tests/vllm/test_generate.py).

Supported: decoder self-attention (causal), grouped-query attention, sliding windows, any head
size and block size. Not supported (a clear error when a model needs it): ALiBi, logit soft-caps,
attention sinks, quantized (fp8) KV caches, encoder and cross attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)
from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
from vllm.v1.kv_cache_interface import KVCacheLayout

__all__ = [
    "NAME",
    "RegistryAttentionBackend",
    "RegistryAttentionImpl",
    "RegistryAttentionMetadata",
    "RegistryAttentionMetadataBuilder",
]


#: The backend's name among vLLM's attention backends (an attention layer looks itself up by it).
NAME = "ACCELREG_TORCH"


@dataclass
class RegistryAttentionMetadata:
    """What one step's attention needs: per request, where its queries are and how long its
    context is (on the host, to loop over), and the device tensors that address the cache."""

    num_actual_tokens: int
    query_start_loc: list[int]
    seq_lens: list[int]
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    causal: bool = True


class RegistryAttentionMetadataBuilder(AttentionMetadataBuilder[RegistryAttentionMetadata]):
    """Builds :class:`RegistryAttentionMetadata` from vLLM's common metadata."""

    def __init__(
        self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any, device: torch.device
    ) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)

    def build(
        self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False
    ) -> RegistryAttentionMetadata:
        m = common_attn_metadata
        if isinstance(m.causal, torch.Tensor):
            raise NotImplementedError(
                "accelreg's torch-native attention supports causal or full attention only"
            )
        n = m.num_reqs
        return RegistryAttentionMetadata(
            num_actual_tokens=m.num_actual_tokens,
            query_start_loc=[int(x) for x in m.query_start_loc_cpu[: n + 1].tolist()],
            seq_lens=[int(x) for x in m.seq_lens[:n].tolist()],
            block_table=m.block_table_tensor[:n],
            slot_mapping=m.slot_mapping[: m.num_actual_tokens],
            causal=bool(m.causal),
        )


def _split(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The key and value caches of one layer's ``[blocks, kv_heads, block_size, 2 * head_size]``
    cache: each ``[blocks, kv_heads, block_size, head_size]``."""
    head_size = kv_cache.shape[-1] // 2
    return kv_cache[..., :head_size], kv_cache[..., head_size:]


class RegistryAttentionImpl(AttentionImpl[RegistryAttentionMetadata]):
    """Decoder self-attention over the paged cache, in torch operations."""

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        alibi_slopes: list[float] | None = None,
        sliding_window: int | None = None,
        kv_cache_dtype: str = "auto",
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        sinks: torch.Tensor | None = None,
    ) -> None:
        unsupported = [
            what
            for what, used in (
                ("ALiBi", alibi_slopes is not None),
                ("logit soft-capping", bool(logits_soft_cap)),
                ("attention sinks", sinks is not None),
                (
                    f"a {kv_cache_dtype} KV cache",
                    kv_cache_dtype not in ("auto", "float16", "bfloat16", "float32"),
                ),
                (f"{attn_type} attention", attn_type != AttentionType.DECODER),
            )
            if used
        ]
        if unsupported:
            raise NotImplementedError(
                "accelreg's torch-native attention (the registry platform's) does not support "
                + ", ".join(unsupported)
                + ": this model needs a vLLM platform of the vendor's own"
            )
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        self.sliding_window = sliding_window
        self.kv_cache_dtype = kv_cache_dtype
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name

    def do_kv_cache_update(
        self,
        layer: torch.nn.Module,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Write this step's keys and values into their slots (``slot = block * block_size +
        offset``; a negative slot is padding and is skipped)."""
        key_cache, value_cache = _split(kv_cache)
        block_size = key_cache.shape[2]
        n = slot_mapping.shape[0]
        slots = slot_mapping.to(torch.long)
        keep = slots >= 0
        if not bool(keep.all()):
            slots, key, value = slots[keep], key[:n][keep], value[:n][keep]
        blocks, offsets = slots // block_size, slots % block_size
        key_cache[blocks, :, offsets] = key[: slots.shape[0]].to(key_cache.dtype)
        value_cache[blocks, :, offsets] = value[: slots.shape[0]].to(value_cache.dtype)

    def forward(
        self,
        layer: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: RegistryAttentionMetadata | None,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention of each request's queries over its whole cached context; ``output`` is
        ``[tokens, heads, head_size]`` (or flattened heads) and is filled in place."""
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("accelreg's torch-native attention has no fused output quantization")
        if attn_metadata is None:  # a profiling run without a cache
            return output
        key_cache, value_cache = _split(kv_cache)
        block_size = key_cache.shape[2]
        groups = self.num_heads // self.num_kv_heads
        starts = attn_metadata.query_start_loc
        out = output.view(output.shape[0], self.num_heads, self.head_size)
        for i, seq_len in enumerate(attn_metadata.seq_lens):
            start, end = starts[i], starts[i + 1]
            q_len = end - start
            if q_len == 0:
                continue
            n_blocks = -(-seq_len // block_size)
            blocks = attn_metadata.block_table[i, :n_blocks].to(torch.long)
            # [blocks, kv_heads, block_size, head_size] -> [kv_heads, context, head_size]
            k = key_cache[blocks].transpose(0, 1).reshape(self.num_kv_heads, -1, self.head_size)[:, :seq_len]
            v = (
                value_cache[blocks]
                .transpose(0, 1)
                .reshape(self.num_kv_heads, -1, self.head_size)[:, :seq_len]
            )
            if groups > 1:
                k = k.repeat_interleave(groups, dim=0)
                v = v.repeat_interleave(groups, dim=0)
            q = query[start:end].view(q_len, self.num_heads, self.head_size).transpose(0, 1)
            mask = self._mask(q_len, seq_len, attn_metadata.causal, q.device)
            attended = F.scaled_dot_product_attention(
                q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask, scale=self.scale
            )
            out[start:end] = attended.transpose(0, 1)
        return output

    def _mask(self, q_len: int, seq_len: int, causal: bool, device: torch.device) -> torch.Tensor | None:
        """Which context positions each query may attend to (``None``: all of them)."""
        if not causal and self.sliding_window is None:
            return None
        positions = torch.arange(seq_len - q_len, seq_len, device=device)[:, None]
        context = torch.arange(seq_len, device=device)[None, :]
        allowed = context <= positions if causal else torch.ones_like(context <= positions)
        if self.sliding_window is not None:
            allowed = allowed & (context > positions - self.sliding_window)
        return allowed


class RegistryAttentionBackend(AttentionBackend):
    """vLLM's attention backend on the registry platform (torch operations only)."""

    accept_output_buffer: bool = True
    forward_includes_kv_cache_update: bool = False
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[Any]] = ["auto", "float16", "bfloat16"]

    @staticmethod
    def get_name() -> str:
        return NAME

    @staticmethod
    def get_impl_cls() -> type[RegistryAttentionImpl]:
        return RegistryAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[RegistryAttentionMetadataBuilder]:
        return RegistryAttentionMetadataBuilder

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return []  # any

    @classmethod
    def supports_head_size(cls, head_size: int) -> bool:
        return head_size > 0

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_non_causal(cls) -> bool:
        return True

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple[KVCacheLayout, ...]:
        return (KVCacheLayout.LBHNC,)


if NAME not in AttentionBackendEnum.__members__:  # vLLM's attention layers look backends up by name
    register_backend(NAME, f"{__name__}.{RegistryAttentionBackend.__qualname__}")
