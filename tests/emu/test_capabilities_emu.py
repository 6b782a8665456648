"""``accelreg.capabilities()`` on the emulated accelerator (issue 36, part 2).

The emulator declares what its devices compute in as a vendor does (a ``dtypes`` probe that asks
its runtime: a small computation in each dtype on the device), and must answer the same under
every name it presents. With its plugin disabled, accelreg's built-in plugins answer from the
impersonated runtimes: npu, mlu, musa and sdaa declare nothing, so the registry asks
``torch.<name>.is_bf16_supported()`` and ``.get_amp_supported_dtype()``; hpu asks Gaudi's
generation. One child process per name (tests/_matrix.py: the first name in the default run).
"""

from __future__ import annotations

import pytest

from accelreg.testing import run_python

from .._matrix import emu_names

pytestmark = pytest.mark.emu

ANSWERS = """
import json, sys
import accelreg
if sys.argv[1:] == ["builtin"]:
    accelreg.configure(disable=["emu"])
out = {}
for index in (0, 1):
    caps = accelreg.capabilities(index)
    out[caps.device + "/" + str(index)] = {d.dtype: [d.supported, d.source, d.reason] for d in caps.dtypes}
out["failures"] = [str(f) for f in accelreg.failures()]
print(json.dumps(out))
"""

#: What the emulator's own plugin answers on every device, under every name.
EMULATOR = {
    "bfloat16": [True, "probe", "a matrix multiply and a layer norm in bfloat16 ran"],
    "float16": [True, "probe", "a matrix multiply and a layer norm in float16 ran"],
    "float8_e4m3fn": [True, "probe", "a scaled matrix multiply (torch._scaled_mm) on float8_e4m3fn ran"],
    "float8_e5m2": [True, "probe", "a scaled matrix multiply (torch._scaled_mm) on float8_e5m2 ran"],
}


def _run(name: str, *args: str) -> dict:
    code = ANSWERS.replace("sys.argv[1:]", repr(list(args)))
    return run_python(code, name=name, devices=2).value


def _devices(name: str) -> list[str]:
    return ["hpu/0", "hpu/1"] if name == "hpu" else [f"{name}:0/0", f"{name}:1/1"]


@pytest.mark.parametrize("name", emu_names(("npu", "emu", "mlu", "musa", "sdaa", "hpu")))
def test_the_emulator_answers_identically_under_every_name(name: str) -> None:
    value = _run(name)
    assert value.pop("failures") == []
    assert value == dict.fromkeys(_devices(name), EMULATOR), value


def _runtime(name: str) -> dict:
    return {
        "bfloat16": [True, "runtime", f"torch.{name}.is_bf16_supported() answered True"],
        "float16": [True, "runtime", f"torch.{name}.get_amp_supported_dtype() lists torch.float16"],
        "float8_e4m3fn": [
            None,
            "unknown",
            f"unknown: {name}'s plugin (accelreg) declares nothing about float8_e4m3fn (BackendSpec.dtypes), "
            "and torch asks runtimes nothing about float8_e4m3fn",
        ],
        "float8_e5m2": [
            None,
            "unknown",
            f"unknown: {name}'s plugin (accelreg) declares nothing about float8_e5m2 (BackendSpec.dtypes), "
            "and torch asks runtimes nothing about float8_e5m2",
        ],
    }


GAUDI2 = {
    "bfloat16": [True, "probe", "every Gaudi computes in bfloat16 (Gaudi2)"],
    "float16": [True, "probe", "Gaudi2 computes in it (Gaudi2 and later do)"],
    "float8_e4m3fn": [True, "probe", "Gaudi2 computes in it (Gaudi2 and later do)"],
    "float8_e5m2": [True, "probe", "Gaudi2 computes in it (Gaudi2 and later do)"],
}


@pytest.mark.parametrize("name", emu_names(("npu", "mlu", "musa", "sdaa", "hpu")))
def test_builtin_plugins_answer_from_the_vendor_runtime(name: str) -> None:
    value = _run(name, "builtin")
    assert value.pop("failures") == []
    expected = GAUDI2 if name == "hpu" else _runtime(name)
    assert value == dict.fromkeys(_devices(name), expected), value
