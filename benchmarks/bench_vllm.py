"""vLLM tokens per second: stock against ``accelreg run`` on vLLM's CPU platform (issue 30, goal:
at most 2 % slower), and accelreg's registry platform on the emulated npu (reported).

    python benchmarks/bench_vllm.py --rounds 5        # needs vLLM: PYTHONPATH=<the vllm layer>
    python benchmarks/bench_vllm.py --choice-only     # the platform choice alone (seconds)

Each round runs every arm once, in a rotating order (machine noise hits all alike), each in fresh
processes: the script of the vLLM tests (``tests/vllm/_generate.py``, no accelreg line in it)
starts an engine for the tiny Llama, generates ``--repeat`` times (greedy, ``--prompts`` prompts
of ``--max-tokens`` tokens each; the first generation warms up and is not counted) and reports
the seconds of each. Tokens per second of a run is its fastest generation (the one the shared
machine disturbed least); an arm's figure is the median over rounds, and the comparison is the
median of the rounds' paired ratios (each round's ``accelreg run`` over that round's stock). The
arms:

* ``stock (cpu)`` — ``python _generate.py``: vLLM chooses its CPU platform itself;
* ``accelreg run (cpu)`` — ``accelreg run -- python _generate.py``: every process of the engine
  asks the registry, which chooses vLLM's own CPU platform (no accelerator here);
* ``accelreg run (emulated npu)`` — the same with the emulated npu: the registry platform, the
  model on ``npu:0`` of the emulator (every operator through its host fallback).

Start-up (building the engine) is reported too. Every arm's tokens must equal stock's.

On a shared machine a whole engine's tokens/s swings by tens of percent from run to run, far
more than the 2 % goal, so the one thing ``accelreg run`` adds to each of the engine's processes
is timed alone as well, in one process with low noise (``--choice-rounds``): vLLM's own choice of
platform (``resolve_current_platform_cls_qualname`` as shipped) against accelreg's (the registry
built from scratch, every platform plugin loaded and asked, the choice made), alternating, median.
After that choice both run the same platform class, worker and kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "vllm" / "_generate.py"
sys.path.insert(0, str(SCRIPT.parent))
from _generate import MARK, build  # noqa: E402 - the tests' script, by path

TARGET = 0.02


def _environ(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELREG_") or k == "ACCELREG_EMU_CACHE"}
    env.update({"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}, **extra)
    return env


def _arms(model: str, args: argparse.Namespace) -> dict[str, tuple[list[str], dict[str, str]]]:
    script = [
        sys.executable,
        str(SCRIPT),
        model,
        "--prompts",
        str(args.prompts),
        "--max-tokens",
        str(args.max_tokens),
        "--repeat",
        str(args.repeat + 1),
    ]
    run = [sys.executable, "-m", "accelreg", "run", "--", *script]
    return {
        "stock (cpu)": (script, _environ()),
        "accelreg run (cpu)": (run, _environ()),
        "accelreg run (emulated npu)": (run, _environ(ACCELREG_EMU_NAME="npu", ACCELREG_EMU_DEVICES="2")),
    }


def _once(argv: list[str], env: dict[str, str]) -> dict:
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)
    line = next((x for x in proc.stdout.splitlines() if x.startswith(MARK)), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(
            f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        )
    return json.loads(line[len(MARK) :])


_CHOICE = """
import json, statistics, sys, time
import accelreg
import vllm.platforms as platforms
from accelreg.integrations import vllm as ar_vllm

stock_fn = platforms.resolve_current_platform_cls_qualname
stock, ours = [], []
for _ in range(int(sys.argv[1])):
    t = time.perf_counter(); stock_fn(); stock.append(time.perf_counter() - t)
    ar_vllm.disable(); accelreg.reset(); ar_vllm.enable()
    t = time.perf_counter(); platforms.resolve_current_platform_cls_qualname(); ours.append(time.perf_counter() - t)
print(json.dumps({"stock_ms": statistics.median(stock) * 1e3, "accelreg_ms": statistics.median(ours) * 1e3}))
"""


def _choice_cost(rounds: int) -> dict[str, float]:
    """Milliseconds of vLLM's own platform choice and of accelreg's, in one fresh process."""
    proc = subprocess.run(
        [sys.executable, "-c", _CHOICE, str(rounds)],
        capture_output=True,
        text=True,
        env=_environ(),
        timeout=900,
    )
    if proc.returncode != 0:
        raise SystemExit(f"timing the platform choice failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3, help="timed generations per run (after one warm-up)")
    p.add_argument("--choice-rounds", type=int, default=21, help="timings of the platform choice alone")
    p.add_argument("--choice-only", action="store_true", help="time the platform choice alone (no engines)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.choice_only:
        print(json.dumps(_choice_cost(args.choice_rounds)))
        return
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        model = str(Path(tmp) / "tiny-llama")
        build(model)
        arms = _arms(model, args)
        rates: dict[str, list[float]] = {name: [] for name in arms}
        startups: dict[str, list[float]] = {name: [] for name in arms}
        tokens: dict[str, list] = {}
        names = list(arms)
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                got = _once(*arms[name])
                rates[name].append(got["generated"] / min(got["seconds"][1:]))
                startups[name].append(got["startup"])
                tokens.setdefault(name, got["tokens"])
                print(f"round {r + 1} {name}: {rates[name][-1]:.1f} tokens/s", file=sys.stderr, flush=True)
    result = {
        "load_before": load,
        "load_after": os.getloadavg(),
        "arms": {
            name: {
                "tokens_per_s": statistics.median(rates[name]),
                "runs": rates[name],
                "startup_s": statistics.median(startups[name]),
                "same_tokens_as_stock": tokens[name] == tokens["stock (cpu)"],
            }
            for name in arms
        },
    }
    result["choice"] = _choice_cost(args.choice_rounds)
    ratios = [
        run / stock for run, stock in zip(rates["accelreg run (cpu)"], rates["stock (cpu)"], strict=True)
    ]
    result["paired_ratios"] = ratios
    result["accelreg_run_slower"] = 1 - statistics.median(ratios)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"tokens/s, median of {args.rounds} rounds ({args.prompts} prompts x {args.max_tokens} tokens, greedy):"
    )
    print("| arm | tokens/s | runs | engine start-up (s) | tokens equal stock's |")
    print("| --- | ---: | --- | ---: | --- |")
    for name, arm in result["arms"].items():
        runs = ", ".join(f"{x:.0f}" for x in arm["runs"])
        same = "yes" if arm["same_tokens_as_stock"] else "NO"
        print(f"| {name} | {arm['tokens_per_s']:.1f} | {runs} | {arm['startup_s']:.1f} | {same} |")
    verdict = "within" if result["accelreg_run_slower"] <= TARGET else "OVER"
    paired = ", ".join(f"{x:.3f}" for x in ratios)
    print(
        f"accelreg run / stock on the CPU platform, paired by round: median {statistics.median(ratios):.3f} "
        f"({paired}): {result['accelreg_run_slower']:+.1%} slower ({verdict} the 2 % goal)"
    )
    c = result["choice"]
    print(
        f"platform choice per process, median of {args.choice_rounds}: vLLM's own {c['stock_ms']:.2f} ms, "
        f"accelreg's {c['accelreg_ms']:.2f} ms (registry built, plugins asked)"
    )
    print(f"load average before/after: {load[0]:.2f} / {result['load_after'][0]:.2f}")


if __name__ == "__main__":
    main()
