"""A vLLM script as users write one — no accelreg line unless ``--install`` is given — run by the
vLLM tests and by benchmarks/bench_vllm.py.

    python tests/vllm/_generate.py MODEL_DIR [--tp N] [--install] [--max-tokens N] [--prompts N]

Generates greedily from fixed token ids with the model at ``MODEL_DIR`` (built there first by
:func:`build` when missing: a random-init Llama small enough for a CPU, whose head dimension of
64 vLLM's CPU attention kernels accept) and prints one JSON line: the platform vLLM chose in this
process, each worker's platform and device (vLLM spawns the engine core and its workers: each
chooses for itself), the tokens, and the seconds the generation took, on the line that
starts with :data:`MARK`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

#: The tiny Llama: vocab 512, hidden 256 (4 heads of 64, 2 KV heads), 2 layers.
CONFIG = {
    "vocab_size": 512,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}
PROMPTS = ([1, 5, 9, 42, 7], [3, 100, 200], [17, 4, 4, 250, 11, 300, 2], [450])
#: Starts the result line (vLLM logs to stdout too, before and after it).
MARK = "RESULT "


def build(path: str) -> None:
    """Save the tiny Llama (seeded random weights) at ``path`` unless it is there."""
    if os.path.exists(os.path.join(path, "config.json")):
        return
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**CONFIG)).save_pretrained(path)


def _where(worker: object) -> list[str]:
    """Run in each vLLM worker: the platform that process chose and the worker's device."""
    from vllm.platforms import current_platform

    return [type(current_platform).__name__, str(worker.device)]  # type: ignore[attr-defined]


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--install", action="store_true", help="call accelreg.install() first")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--prompts", type=int, default=len(PROMPTS), help="how many prompts (cycled)")
    p.add_argument("--repeat", type=int, default=1, help="generate this many times (timed each)")
    args = p.parse_args(argv)
    build(args.model)
    if args.install:
        import accelreg

        accelreg.install()
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    started = time.perf_counter()
    llm = LLM(
        model=args.model,
        skip_tokenizer_init=True,
        enforce_eager=True,
        dtype="float32",
        max_model_len=128,
        tensor_parallel_size=args.tp,
        gpu_memory_utilization=0.1,
        kv_cache_memory_bytes=16 << 20,
    )
    startup = time.perf_counter() - started
    prompts = [{"prompt_token_ids": PROMPTS[i % len(PROMPTS)]} for i in range(args.prompts)]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    seconds, tokens = [], []
    for _ in range(args.repeat):
        t = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds.append(time.perf_counter() - t)
        tokens = [list(o.outputs[0].token_ids) for o in outputs]
    workers = llm.collective_rpc(_where) if os.environ.get("VLLM_ALLOW_INSECURE_SERIALIZATION") == "1" else []
    print(
        MARK
        + json.dumps(
            {
                "platform": type(current_platform).__name__,
                "workers": workers,
                "tokens": tokens,
                "startup": startup,
                "seconds": seconds,
                "generated": sum(len(t) for t in tokens),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":  # vLLM spawns its engine core and workers: they import this module
    main(sys.argv[1:])
