"""safetensors onto an emulated device no release lists (through accelreg's seam) vs onto the cpu.

    python benchmarks/bench_safetensors.py --rounds 7     # prints a Markdown table (about 3 minutes)

A safetensors file of about 570 MB (30 float32 matrices of 16 MiB and one of 64 MiB, the largest
tensor) is written under /tmp and removed at the end. Each arm loads it with
``safetensors.torch.load_file`` in a fresh process with ``accelreg.install()`` (the runtime, where
there is one, brought up before the clock starts); the arms run in turn, in an order that rotates
every round, and each figure is the median over the rounds:

* ``cpu (mapped)``: ``load_file(path, device="cpu")``, nothing read (safetensors maps the file; a
  page is read when a tensor is first used);
* ``cpu, read``: the same, then one element of every page read, so the whole file is in memory:
  the least any load that reads the data does;
* ``cpu, copied``: the same, then each tensor cloned, as a device load copies it to the device;
* ``emu (seam)``: ``device="emu:0"``, a name no safetensors release takes (``ACCELREG_EMU_NAME=emu``):
  opened on the cpu, each tensor moved to the device as it is read, its mapped pages given back;
* ``emu (seam, pages kept)``: the same with the pages kept mapped until the handle closes, which
  is what safetensors' own device path does;
* ``npu (safetensors' own)``: ``device="npu:0"`` on the emulator presenting itself as npu, a name
  every release takes: the seam passes it through untouched (the reference for a device load).

Time is the ``load_file`` call (with the reading or copying, for those arms): wall time, and the
process's CPU time (user + system, every thread), which other work on a shared machine does not
inflate. Memory is the
process's peak RSS (``VmHWM``, reset just before the load) and the same less the RSS just before
the load (``added``); the emulated device's memory is host memory, so a device load adds the
file's size there by itself.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ARMS = {
    "cpu (mapped)": ("cpu", None),
    "cpu, read": ("cpu", None),
    "cpu, copied": ("cpu", None),
    "emu (seam)": ("emu:0", "emu"),
    "emu (seam, pages kept)": ("emu:0", "emu"),
    "npu (safetensors' own)": ("npu:0", "npu"),
}
LARGEST = 64 << 20


def _status(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def child(arm: str, path: str) -> None:
    """One load in this process; prints its figures as JSON."""
    import accelreg

    accelreg.install()
    import torch
    from safetensors.torch import load_file

    device, emulated = ARMS[arm]
    if emulated is not None:
        accelreg.resolve(device)  # the runtime up before the clock starts
        torch.ones(1, device=device)
    if arm == "emu (seam, pages kept)":
        from accelreg.integrations.safetensors import pages

        pages.Mapping.release = lambda self, tensor: 0
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # reset VmHWM to the current RSS
    before = _status("VmRSS")
    cpu_start = time.process_time()
    start = time.perf_counter()
    loaded = load_file(path, device=device)
    if arm == "cpu, read":
        page = 4096
        for tensor in loaded.values():
            flat = tensor.view(-1).view(torch.uint8)
            float(flat[::page].sum())
    elif arm == "cpu, copied":
        loaded = {k: v.clone() for k, v in loaded.items()}
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu_start
    peak = _status("VmHWM")
    devices = sorted({str(t.device) for t in loaded.values()})
    total = sum(t.numel() * t.element_size() for t in loaded.values())
    print(
        json.dumps(
            {
                "seconds": seconds,
                "cpu_seconds": cpu_seconds,
                "before": before,
                "peak": peak,
                "devices": devices,
                "bytes": total,
            }
        )
    )


def write_file(folder: str) -> tuple[str, int]:
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    tensors = {f"layers.{i}.weight": torch.randn(2048, 2048) for i in range(30)}
    tensors["embed.weight"] = torch.randn(16384, 1024)  # 64 MiB, the largest
    path = os.path.join(folder, "model.safetensors")
    save_file(tensors, path)
    return path, os.path.getsize(path)


def run_arm(arm: str, path: str) -> dict[str, object]:
    _device, emulated = ARMS[arm]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELREG_")}
    if "ACCELREG_EMU_CACHE" in os.environ:
        env["ACCELREG_EMU_CACHE"] = os.environ["ACCELREG_EMU_CACHE"]
    if emulated is not None:
        env.update(ACCELREG_EMU_NAME=emulated, ACCELREG_EMU_DEVICES="1", ACCELREG_EMU_MEMORY="4GiB")
    proc = subprocess.run(
        [sys.executable, __file__, "--child", arm, path], capture_output=True, text=True, env=env, timeout=300
    )
    if proc.returncode != 0:
        raise SystemExit(f"{arm}: exited {proc.returncode}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="fresh processes per arm (median)")
    parser.add_argument("--child", nargs=2, metavar=("ARM", "FILE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    import safetensors
    import torch

    folder = tempfile.mkdtemp(prefix="accelreg-bench-safetensors-", dir="/tmp")
    try:
        path, size = write_file(folder)
        with open(path, "rb") as fh:  # the page cache warm for every arm
            while fh.read(1 << 24):
                pass
        arms = list(ARMS)
        for arm in arms:  # untimed warm-up: imports, the emulator's build cache
            run_arm(arm, path)
        samples: dict[str, list[dict[str, object]]] = {arm: [] for arm in arms}
        for r in range(args.rounds):
            for arm in arms[r % len(arms) :] + arms[: r % len(arms)]:
                samples[arm].append(run_arm(arm, path))
    finally:
        for name in os.listdir(folder):
            os.unlink(os.path.join(folder, name))
        os.rmdir(folder)

    def med(arm: str, key: str) -> float:
        return statistics.median(float(s[key]) for s in samples[arm])  # type: ignore[arg-type]

    mib = 1 << 20
    print(
        f"`load_file` of a {size / 1e6:.0f} MB safetensors file (largest tensor {LARGEST // mib} MiB), "
        f"median of {args.rounds} fresh processes per arm, in rotating order (safetensors "
        f"{safetensors.__version__}, torch {torch.__version__}, {os.cpu_count()} cores)"
    )
    print()
    print(
        "| arm | devices | wall (s) | CPU (s) | CPU / cpu, read's | CPU / cpu, copied's | peak RSS (MiB) "
        "| added (MiB) | added - cpu, read's (MiB) |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    read_t, copy_t = med("cpu, read", "cpu_seconds"), med("cpu, copied", "cpu_seconds")
    read_added = med("cpu, read", "peak") - med("cpu, read", "before")
    for arm in arms:
        cpu = med(arm, "cpu_seconds")
        added = med(arm, "peak") - med(arm, "before")
        devices = ", ".join(samples[arm][0]["devices"])  # type: ignore[arg-type]
        print(
            f"| {arm} | {devices} | {med(arm, 'seconds'):.3f} | {cpu:.3f} | {cpu / read_t:.2f} "
            f"| {cpu / copy_t:.2f} | {med(arm, 'peak') / mib:.0f} | {added / mib:.0f} "
            f"| {(added - read_added) / mib:+.0f} |"
        )
    print()
    print("```json")
    print(json.dumps({"bytes": size, "largest": LARGEST, "samples": samples}))
    print("```")


if __name__ == "__main__":
    main()
