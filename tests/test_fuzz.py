"""Generated bad inputs, counted: resolve(), configure(), config files, visible-device variables,
max_memory keys and device maps. Every case ends in a documented, typed error (or, where the input is valid,
in exactly the right answer): zero wrong devices, zero crashes of other kinds.

The corpus is deterministic (fixed seeds) so the counts in docs/reliability.md are stable;
``python tests/test_fuzz.py`` prints them.
"""

from __future__ import annotations

import operator
import random
import re
import string
import sys
from collections import Counter
from pathlib import Path

import torch

import accelreg
from accelreg import ConfigError, DeviceError, DeviceMapError
from accelreg.config import load_settings
from accelreg.planner.budgets import parse_budgets
from accelreg.registry.visible import parse_visible_devices, parse_visible_devices_truncating

try:
    from ._fakes import LyingInt, plugin, spec
except ImportError:  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests._fakes import LyingInt, plugin, spec

NAMES = [
    "cuda",
    "xpu",
    "npu",
    "cpu",
    "meta",
    "disk",
    "auto",
    "hpu",
    "CUDA",
    "Cuda",
    "cud",
    "cudaa",
    "",
    " ",
    "gpu",
]
INDICES = ["0", "1", "2", "-1", "01", "1.0", "1e0", "0x1", "", " 1", "1 ", "١", "9" * 12, "+1", "𝟷"]
SEPS = [":", "::", " :", ": ", ";", "/", "", "-"]
VALID_STRINGS = {
    "cuda": torch.device("cuda", 0),
    "cuda:0": torch.device("cuda", 0),
    "cuda:1": torch.device("cuda", 1),
    "cuda:01": torch.device("cuda", 1),
    "cpu": torch.device("cpu"),
    "cpu:0": torch.device("cpu"),
    "meta": torch.device("meta"),
    "meta:0": torch.device("meta"),
    "auto": torch.device("cuda", 0),
    "xpu:0": torch.device("xpu", 0),
    "xpu": torch.device("xpu", 0),
}


def parse_cuda(value: str) -> tuple[str, ...]:
    return parse_visible_devices_truncating(value, var="CUDA_VISIBLE_DEVICES")


def _machine() -> None:
    accelreg.reset()
    accelreg.register(plugin(spec("cuda", 2, priority=100), spec("xpu", 1, priority=90)), "fakeplugin_fuzz")


def _resolve_cases(rng: random.Random) -> list[object]:
    cases: list[object] = []
    for name in NAMES:
        for sep in SEPS:
            for idx in INDICES:
                cases.append(f"{name}{sep}{idx}")
    for _ in range(1500):
        cases.append("".join(rng.choice(string.printable) for _ in range(rng.randint(0, 10))))
    cases += [rng.randint(-(10**12), 10**12) for _ in range(400)] + list(range(-5, 6))
    cases += [
        True,
        False,
        0.0,
        1.0,
        float("nan"),
        float("inf"),
        1 + 0j,
        b"cuda",
        bytearray(b"0"),
        None,
        (),
        [],
        [0],
        {"": 0},
        {0},
        object(),
        Ellipsis,
        torch.device("cuda", 5),
        torch.device("xpu", 1),
        torch.device("ve", 0),
        torch.device("cpu"),
        torch.device("meta"),
        LyingInt(1),
        LyingInt(0),
        LyingInt(2),
        LyingInt(-1),
    ]
    return cases


def _expected(case: object) -> torch.device | type[BaseException]:
    if case is None:
        return torch.device("cuda", 0)
    if isinstance(case, bool) or not isinstance(case, (int, str, torch.device)):
        return TypeError
    if isinstance(case, int):
        index = operator.index(case)  # the value Python and torch use
        return torch.device("cuda", index) if 0 <= index < 2 else DeviceError
    if isinstance(case, torch.device):
        key = str(case)
        return VALID_STRINGS.get(key, DeviceError)
    return VALID_STRINGS.get(case, DeviceError)


def check_resolve(rng: random.Random) -> Counter[str]:
    _machine()
    seen: Counter[str] = Counter()
    for case in _resolve_cases(rng):
        want = _expected(case)
        try:
            got = accelreg.resolve(case)
        except (DeviceError, TypeError) as exc:
            assert isinstance(want, type) and isinstance(exc, want), (
                f"resolve({case!r}) raised {exc!r}, expected {want}"
            )
            assert str(exc), f"resolve({case!r}) raised an empty message"
            seen[f"resolve: {type(exc).__name__}"] += 1
            continue
        assert got == want, f"resolve({case!r}) gave {got}, expected {want}"
        seen["resolve: right device"] += 1
    return seen


def check_configure(rng: random.Random) -> Counter[str]:
    seen: Counter[str] = Counter()
    values = [
        None,
        "npu",
        ["npu"],
        ["NPU"],
        ["npu", "npu"],
        ["cpu", "npu"],
        ["cpu"],
        [1],
        [""],
        ["a b"],
        "",
        0,
        1,
        -1,
        1.5,
        float("nan"),
        float("inf"),
        True,
        False,
        {"npu": "x"},
        {"npu": 1},
        {"NPU": "d"},
        {"npu": "bad dist!"},
        "yes",
        "npu=acme",
        ["x" * 70],
        (),
        ("npu",),
        [None],
        1e9,
        0.5,
        10**400,
        -(10**400),
        [10**5000],
        {"npu": 10**5000},
    ]
    keys = [
        "priority",
        "disable",
        "plugins",
        "strict",
        "disable_plugin_autoload",
        "providers",
        "probe_timeout",
        "prority",
        "Priority",
    ]
    for key in keys:
        for value in values:
            for _ in range(4):
                try:
                    accelreg.configure(**{key: value})
                except ConfigError as exc:
                    assert str(exc)
                    seen["configure: ConfigError"] += 1
                else:
                    seen["configure: accepted"] += 1
                accelreg.reset()
    for _ in range(300):
        key = rng.choice(keys)
        value = rng.choice(values)
        try:
            accelreg.configure(**{key: value})
            seen["configure: accepted"] += 1
        except ConfigError:
            seen["configure: ConfigError"] += 1
        accelreg.reset()
    return seen


def check_files(rng: random.Random, tmp: Path) -> Counter[str]:
    seen: Counter[str] = Counter()
    fragments = [
        "priority = ",
        "disable = ",
        "strict = ",
        "probe_timeout = ",
        "providers = ",
        "plugins = ",
        "[tool.accelreg]\n",
        "[x]\n",
        "['npu']",
        "['NPU']",
        "'npu'",
        "[1, 2]",
        "true",
        "'true'",
        "-1",
        "1e400",
        "{npu = 'a'}",
        "{npu = 1}",
        "[",
        "]",
        '"',
        "\n",
        "=",
        "#",
        "\x00",
        "nan",
        "inf",
        "['cpu', 'npu']",
        "['npu', 'npu']",
        "5",
    ]
    folder = tmp / "fuzzfiles"
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(1500):
        text = "".join(rng.choice(fragments) for _ in range(rng.randint(1, 8)))
        name = "pyproject.toml" if i % 3 == 0 else "accelreg.toml"
        for other in ("pyproject.toml", "accelreg.toml"):
            (folder / other).unlink(missing_ok=True)
        (folder / name).write_text(text, encoding="utf-8", errors="surrogateescape")
        settings = load_settings(cwd=folder, environ={"XDG_CONFIG_HOME": str(tmp / "noxdg")})
        if settings.errors:
            assert str(folder / name) in settings.errors[0]
            try:
                load_settings(
                    cwd=folder, environ={"ACCELREG_STRICT": "1", "XDG_CONFIG_HOME": str(tmp / "noxdg")}
                )
            except ConfigError:
                seen["config file: reported, ConfigError in strict mode"] += 1
            else:  # pragma: no cover - a failure of the test, never expected
                raise AssertionError(f"strict mode accepted a broken file: {text!r}")
        else:
            seen["config file: valid"] += 1
    return seen


HOSTILE_FILES = [
    "x = " + "[" * 5000 + "]" * 5000,
    "x = " + "{a = " * 3000 + "1" + "}" * 3000,
    "probe_timeout = " + "9" * 5000,
    "probe_timeout = 1" + "0" * 400,
    "probe_timeout = -" + "1" * 400,
    "priority = [" + "1" * 4500 + "]",
    "providers = {npu = " + "2" * 400 + "}",
    "strict = " + "1" * 5000,
]


def check_hostile_files(tmp: Path) -> Counter[str]:
    """Files valid-looking enough to reach the parser, built to break it or the checks behind it:
    each is skipped and reported (strict: ConfigError), wherever it is found."""
    seen: Counter[str] = Counter()
    folder = tmp / "hostile"
    folder.mkdir(parents=True, exist_ok=True)
    for text in HOSTILE_FILES:
        for name, content in (
            ("accelreg.toml", text),
            ("pyproject.toml", "[tool.accelreg]\n" + text),
            ("pyproject.toml", "[tool.other]\n" + text),
        ):
            for other in ("pyproject.toml", "accelreg.toml"):
                (folder / other).unlink(missing_ok=True)
            (folder / name).write_text(content + "\n")
            env = {"XDG_CONFIG_HOME": str(tmp / "noxdg")}
            settings = load_settings(cwd=folder, environ=env)
            if content.startswith("[tool.other]") and _parses(content):
                assert not settings.errors, settings.errors  # someone else's table: not ours to judge
                seen["config file: hostile value in another tool's table, passed over"] += 1
                continue
            assert settings.errors and str(folder / name) in settings.errors[0], (text[:40], settings)
            try:
                load_settings(cwd=folder, environ={**env, "ACCELREG_STRICT": "1"})
            except ConfigError:
                seen["config file: hostile, reported, ConfigError in strict mode"] += 1
            else:  # pragma: no cover - a failure of the test, never expected
                raise AssertionError(f"strict mode accepted a hostile file: {text[:40]!r}")
    return seen


def _parses(text: str) -> bool:
    from accelreg.config import tomllib

    try:
        tomllib.loads(text)
    except Exception:  # noqa: BLE001 - any failure: the file cannot be read
        return False
    return True


_KEY_FORM = re.compile(r"([a-z][a-z0-9_]*)(?::([0-9]{1,9}))?")


def _budget_expected(key: object) -> str | type[BaseException]:
    """The place a max_memory key budgets on the fuzz machine (cuda x2, xpu x1; hpu unindexed)."""
    if isinstance(key, bool) or not isinstance(key, (int, str)):
        return TypeError
    if isinstance(key, int):
        index = operator.index(key)
        return f"cuda:{index}" if 0 <= index < 2 else (DeviceMapError if index < 0 else DeviceError)
    m = _KEY_FORM.fullmatch(key)
    if m is None:
        return DeviceMapError
    name, index = m.group(1), m.group(2)
    if name in ("meta", "auto", "balanced", "balanced_low_0", "sequential"):
        return DeviceMapError
    if name in ("cpu", "disk"):
        return name if index in (None, "0") else DeviceMapError
    if index is not None:
        return f"{name}:{int(index)}"
    return "hpu" if name == "hpu" else DeviceMapError


def check_budget_keys(rng: random.Random) -> Counter[str]:
    """max_memory keys: the accepted forms give exactly their place, anything else a typed error;
    aliases of one device (``hpu`` and ``hpu:0``) are refused as duplicates."""
    _machine()
    seen: Counter[str] = Counter()
    keys: list[object] = [f"{n}{sep}{i}" for n in NAMES for sep in (":", "", " ") for i in INDICES[:8]]
    keys += ["npu0", "banana", "NPU:0", "hpu", "hpu:0", "hpu:1", "cuda", "xpu", "cpu", "disk", "disk:1"]
    keys += [rng.randint(-3, 4) for _ in range(20)] + [LyingInt(1), LyingInt(5), True, 1.0, None, (0,)]
    keys += [
        "".join(rng.choice(string.ascii_lowercase + ":0123 ") for _ in range(rng.randint(1, 8)))
        for _ in range(400)
    ]
    for key in keys:
        want = _budget_expected(key)
        try:
            got = parse_budgets({key: 1}).as_dict()
        except (DeviceMapError, DeviceError, TypeError) as exc:
            assert isinstance(want, type) and isinstance(exc, want), (
                f"max_memory key {key!r}: {exc!r}, expected {want}"
            )
            seen[f"max_memory key: {type(exc).__name__}"] += 1
            continue
        assert got == {want: 1}, f"max_memory key {key!r} gave {got}, expected {want}"
        seen["max_memory key: right place"] += 1
    for pair in (("hpu", "hpu:0"), ("cpu", "cpu:0"), (0, "cuda:0"), ("cuda:1", "cuda:01")):
        try:
            parse_budgets(dict.fromkeys(pair, 1))
        except DeviceMapError as exc:
            assert "twice" in str(exc)
            seen["max_memory key: alias refused as a duplicate"] += 1
        else:  # pragma: no cover - a failure of the test, never expected
            raise AssertionError(f"{pair} accepted as two budgets")
    return seen


def check_visible(rng: random.Random) -> Counter[str]:
    seen: Counter[str] = Counter()
    tokens = [
        "0",
        "1",
        "2",
        "-1",
        "a",
        "GPU-1f2e",
        "MIG-3/1/0",
        "0.1",
        "1-3",
        "",
        " ",
        "00",
        "1,1",
        "NoDevFiles",
        "١",
        "999999999",
    ]
    for _ in range(1500):
        value = ",".join(rng.choice(tokens) for _ in range(rng.randint(0, 4)))
        for options in ({}, {"subdevices": True}, {"ranges": True}, {"uuids": True}):
            try:
                ids = parse_visible_devices(value, var="X", **options)
            except ConfigError as exc:
                assert "X=" in str(exc)
                seen["visible devices: ConfigError"] += 1
            else:
                assert len(set(ids)) == len(ids) and all(ids)
                seen["visible devices: parsed"] += 1
        ids = parse_cuda(value)  # the CUDA runtime's rule: never raises, truncates
        assert len(set(ids)) == len(ids)
        seen["CUDA_VISIBLE_DEVICES: truncated like the runtime"] += 1
    return seen


def check_device_maps(rng: random.Random) -> Counter[str]:
    """Random device maps for a small model: valid ones pass, every other one is a typed error."""
    seen: Counter[str] = Counter()
    _machine()
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 4),
        torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()),
        torch.nn.Linear(4, 2),
    )
    keys = ["", "0", "1", "1.0", "2", "0.weight", "0.bias", "3", "1.1", "x", "1.0.weight"]
    values = [
        "cuda:0",
        "cuda:1",
        "cpu",
        "disk",
        0,
        1,
        2,
        -1,
        "cuda:2",
        "npu:0",
        "CUDA:0",
        True,
        1.0,
        None,
        "meta",
        torch.device("cuda", 1),
    ]
    for _ in range(1200):
        device_map = {rng.choice(keys): rng.choice(values) for _ in range(rng.randint(0, 4))}
        try:
            accelreg.check_device_map(model, device_map)
        except (DeviceMapError, DeviceError, TypeError) as exc:
            assert str(exc)
            seen[f"device map: {type(exc).__name__}"] += 1
        else:
            seen["device map: valid"] += 1
    return seen


def corpus(tmp: Path) -> Counter[str]:
    rng = random.Random(20261202)
    counts: Counter[str] = Counter()
    counts += check_resolve(rng)
    counts += check_configure(rng)
    counts += check_files(rng, tmp)
    counts += check_hostile_files(tmp)
    counts += check_visible(rng)
    counts += check_budget_keys(rng)
    if hasattr(accelreg, "check_device_map"):
        counts += check_device_maps(rng)
    return counts


def test_generated_bad_inputs(tmp_path):
    counts = corpus(tmp_path)
    assert sum(counts.values()) >= 10_000, counts
    assert not [k for k in counts if "wrong" in k]


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        result = corpus(Path(tmp))
    print("| outcome | cases |\n| --- | ---: |")
    for key, value in sorted(result.items()):
        print(f"| {key} | {value} |")
    print(f"| **total** | **{sum(result.values())}** |")
