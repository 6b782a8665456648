"""Every way a user hands a device to safetensors, on the emulated device, as a user writes it
with ``accelreg.install()``: ``python _safetensors_loads.py OUT`` under ``ACCELREG_EMU_NAME``.

A tiny model and a LoRA adapter of it are built on the cpu from fixed seeds (the same files in
every process) and saved as safetensors; then each workflow loads them onto the emulated
device:

* ``safe_open`` (``get_tensor``, ``get_slice``), ``load_file``, ``load_model`` and, where the
  release has it, ``_safe_open_handle``, with ``device="<name>:1"``;
* peft's ``PeftModel.from_pretrained(model_on_device, adapter_dir)``, with and without
  ``low_cpu_mem_usage`` (peft loads the adapter with ``load_file(..., device=<the device type>)``);
* accelerate's ``load_checkpoint_and_dispatch(model, "model.safetensors", device_map=...)`` with
  a map naming one device, and one splitting the model over both devices;
* accelerate's ``load_state(..., map_location="on_device")`` after ``save_state``.

First the canary: with the integration off, ``load_file`` onto the device is refused where the
release does not list the device type. Each workflow also runs on the cpu. Every tensor it produced, moved to the cpu, is written to
``OUT/results.safetensors`` (``<workflow>/<name>``, the cpu run's under ``cpu/<workflow>/...``),
and what it saw (devices, the handle's type) is printed as the last line, JSON.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

import accelreg

accelreg.install()

import safetensors  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file, load_model, save_file  # noqa: E402

#: The vendor package a user of that runtime imports (under ``emu`` the registry brings it up).
VENDOR = {
    "npu": "torch_npu",
    "mlu": "torch_mlu",
    "musa": "torch_musa",
    "sdaa": "torch_sdaa",
    "hpu": "habana_frameworks.torch",
}


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(32, 16)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(16, 16) for _ in range(2)])
        self.head = torch.nn.Linear(16, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)


def build(folder: Path) -> tuple[Path, Path]:
    """model.safetensors and a LoRA adapter folder, from fixed seeds."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model_file = folder / "model.safetensors"
    state = {k: v.contiguous() for k, v in Net().state_dict().items()}
    save_file(state, str(model_file), metadata={"format": "pt"})
    torch.manual_seed(1)
    lora = LoraConfig(r=4, target_modules=["layers.0", "layers.1", "head"], init_lora_weights=False)
    adapter = folder / "adapter"
    get_peft_model(Net(), lora).save_pretrained(str(adapter))
    return model_file, adapter


def main() -> None:
    out = Path(sys.argv[1])
    name = os.environ["ACCELREG_EMU_NAME"]
    if name in VENDOR:
        importlib.import_module(VENDOR[name])
    d0, d1 = str(accelreg.resolve(0)), str(accelreg.resolve(1))
    model_file, adapter = build(out)
    ids = torch.arange(12).reshape(2, 6) % 32
    results: dict[str, torch.Tensor] = {}
    seen: dict[str, object] = {"safetensors": safetensors.__version__}
    # where a tensor made on each lands (hpu addresses no index: accelreg resolves 1 to "hpu")
    seen["device_0"], seen["device_1"] = (str(torch.empty(0, device=d).device) for d in (d0, d1))

    # the canary: stock safetensors (the integration off) refuses a device its core does not list
    from accelreg.integrations import safetensors as ar_safetensors

    ar_safetensors.disable()  # install() enabled it when safetensors was imported
    try:
        load_file(str(model_file), device=d1)
        seen["stock"] = "loaded"
    except Exception as exc:  # noqa: BLE001 - the Rust core's SafetensorError
        seen["stock"] = f"{type(exc).__name__}: {exc}"
    finally:
        ar_safetensors.enable()

    def keep(workflow: str, tensors: dict[str, torch.Tensor]) -> None:
        seen[workflow] = sorted({str(t.device) for t in tensors.values()})
        for key, tensor in tensors.items():
            results[f"{workflow}/{key}"] = tensor.detach().to("cpu").clone()

    for device, prefix in ((d1, ""), ("cpu", "cpu/")):
        # safetensors itself
        with safetensors.safe_open(str(model_file), framework="pt", device=device) as f:
            seen[f"{prefix}handle"] = type(f).__name__
            keep(f"{prefix}safe_open", {k: f.get_tensor(k) for k in f.keys()})
            keep(f"{prefix}slice", {"embed.weight[3:7]": f.get_slice("embed.weight")[3:7]})
        keep(f"{prefix}load_file", load_file(str(model_file), device=device))
        net = Net().to(device)
        load_model(net, str(model_file), device=device)
        keep(f"{prefix}load_model", dict(net.state_dict()))
        if hasattr(safetensors, "_safe_open_handle"):
            with open(model_file, "rb") as fh:
                handle = safetensors._safe_open_handle(fh, "pt", device=device)
                keep(f"{prefix}safe_open_handle", {k: handle.get_tensor(k) for k in handle.keys()})
        # peft: the adapter onto a model on the device (index 1: peft stages the adapter on the
        # device type's current device, then moves each adapter to its base layer's device)
        from peft import PeftModel

        for low in (False, True):
            torch.manual_seed(2)
            base = Net().to(device)
            peft_model = PeftModel.from_pretrained(base, str(adapter), low_cpu_mem_usage=low)
            lora = {k: v for k, v in peft_model.state_dict().items() if "lora_" in k}
            keep(f"{prefix}peft_low_cpu_mem_usage_{low}", lora)
            with torch.no_grad():
                keep(f"{prefix}peft_low_cpu_mem_usage_{low}_forward", {"out": peft_model(ids.to(device))})
        # accelerate: a device map naming the device, and one over both devices
        from accelerate import init_empty_weights, load_checkpoint_and_dispatch

        other = d0 if device != "cpu" else "cpu"
        maps = {
            "dispatch_one": {"": device},
            "dispatch_split": {"embed": device, "layers.0": device, "layers.1": other, "head": other},
        }
        for workflow, device_map in maps.items():
            with init_empty_weights():
                empty = Net()
            dispatched = load_checkpoint_and_dispatch(empty, str(model_file), device_map=device_map)
            keep(f"{prefix}{workflow}", dict(dispatched.state_dict()))
            with torch.no_grad():
                first = next(iter(device_map.values()))
                keep(f"{prefix}{workflow}_forward", {"out": dispatched(ids.to(first))})
    # accelerate's load_state onto the device (what its multi-process ranks do): last, it sets
    # accelerate's process state
    from accelerate import Accelerator

    accelerator = Accelerator()
    torch.manual_seed(3)
    model = accelerator.prepare(Net())
    saved = {k: v.detach().to("cpu").clone() for k, v in model.state_dict().items()}
    accelerator.save_state(str(out / "state"))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    accelerator.load_state(str(out / "state"), map_location="on_device")
    keep("load_state", dict(model.state_dict()))
    keep("cpu/load_state", saved)
    save_file(results, str(out / "results.safetensors"))
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
