"""Every mode of ``accelerate launch`` under ``accelreg run``, on ``emu`` (a name accelerate has
never heard of) and ``npu`` (one it knows, through the emulator's ``torch_npu``): DeepSpeed
(``--use_deepspeed`` with and without ``--zero_stage``, with a DeepSpeed config file, and two
machines on localhost through ``--deepspeed_multinode_launcher standard``), ``--use_fsdp``,
``--multi_gpu`` given, ``--cpu``, ``--num_machines 2``, and the modes an accelerate config file
names (issue 38: the launcher seam set ``multi_gpu`` before accelerate's check of mutually
exclusive modes, so ``--use_deepspeed`` and ``--use_fsdp`` failed on every backend).

Two levels:

* the decision (default group): accelerate's own ``launch_command`` parses the flags and
  decides, in a child process with the emulator, with the launcher seam on; where it would
  start processes, the launcher it chose prepares its command and environment for real
  (``prepare_deepspeed_cmd_env``, ``prepare_multi_gpu_env``, ``prepare_simple_launcher_cmd_env``)
  and the test reads them instead of starting anything;
* the launch (slow group): ``accelreg run -- accelerate launch <mode> _accelerate_train.py``
  trains for real: rank r on ``<name>:r`` (machine r on its physical device r), the registry's
  collectives, ``save_state``/``load_state``, and the whole model's trained parameters equal to
  those of the same script as two cpu processes (fp32, within 1e-5).

The launches run a few at a time (the machine has two cores), each job in its own process
group, killed as a group when done.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from ..deepspeed._harness import free_port
from ..deepspeed.test_launcher import Job, run_jobs
from .test_accelerate_launch import _environ as _launch_environ

pytestmark = pytest.mark.emu

pytest.importorskip("accelerate", reason="accelerate is in the [accelerate] extra")

TRAIN = str(Path(__file__).with_name("_accelerate_train.py"))
TIMEOUT = 500
NAMES = ("emu", "npu")
#: The collectives and the mask variable of each name (the emulator's plugin and accelreg's npu).
COLLECTIVES = {"emu": "emuccl", "npu": "hccl"}
MASKS = {"emu": "ACCELREG_EMU_VISIBLE_DEVICES", "npu": "ASCEND_RT_VISIBLE_DEVICES"}
#: A DeepSpeed config file (ZeRO-1; "auto" values are filled in by accelerate from the script).
DS_CONFIG = {
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": 1},
}
MACHINE = ("--num_machines", "2", "--num_processes", "2", "--main_process_ip", "127.0.0.1")


def _accelerate(*args: str) -> list[str]:
    """The ``accelerate`` command of this environment (its console script, as a user types it)."""
    script = Path(sys.executable).with_name("accelerate")
    base = [str(script)] if script.is_file() else [sys.executable, "-m", "accelerate.commands.accelerate_cli"]
    return [*base, *args]


def _files(folder: Path) -> dict[str, str]:
    """A DeepSpeed config file and accelerate config files of the DeepSpeed and FSDP modes."""
    folder.mkdir(parents=True, exist_ok=True)
    ds = folder / "ds_config.json"
    ds.write_text(json.dumps(DS_CONFIG))
    base = (
        "compute_environment: LOCAL_MACHINE\nnum_machines: 1\nmachine_rank: 0\nnum_processes: 2\n"
        "mixed_precision: 'no'\nuse_cpu: false\n"
    )
    deepspeed = folder / "deepspeed.yaml"
    deepspeed.write_text(base + "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 2\n")
    fsdp = folder / "fsdp.yaml"
    fsdp.write_text(base + "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\n")
    return {"ds": str(ds), "deepspeed.yaml": str(deepspeed), "fsdp.yaml": str(fsdp)}


# -- the decision ----------------------------------------------------------------------------
#: argv (before the script) -> what accelerate's launcher does with it under the registry: the
#: launcher it runs, its processes per node, its nodes, and variables it sets (None: unset).
#: ``{ds}``, ``{deepspeed.yaml}`` and ``{fsdp.yaml}`` are the files of :func:`_files`; ``{mask}``
#: the backend's mask variable.
DECISIONS: dict[str, tuple[list[str], dict[str, Any]]] = {
    "default": ([], {"launcher": "multi_gpu", "nproc": "2"}),
    "one-process": (["--num_processes", "1"], {"launcher": "simple", "processes": 1}),
    "deepspeed": (
        ["--use_deepspeed"],
        {
            "launcher": "deepspeed",
            "nproc": "2",
            "ACCELERATE_USE_DEEPSPEED": "true",
            "ACCELERATE_DEEPSPEED_ZERO_STAGE": None,
        },
    ),
    "deepspeed-zero-stage": (
        ["--use_deepspeed", "--zero_stage", "2", "--num_processes", "2"],
        {"launcher": "deepspeed", "nproc": "2", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2"},
    ),
    "deepspeed-config-file": (
        ["--use_deepspeed", "--deepspeed_config_file", "{ds}"],
        {"launcher": "deepspeed", "nproc": "2", "ACCELERATE_DEEPSPEED_CONFIG_FILE": "{ds}"},
    ),
    "deepspeed-standard-machine-1": (
        [
            "--use_deepspeed",
            *MACHINE,
            "--machine_rank",
            "1",
            "--deepspeed_multinode_launcher",
            "standard",
            "--gpu_ids",
            "1",
        ],
        {"launcher": "deepspeed", "nproc": "1", "nnodes": "2", "{mask}": "1"},
    ),
    "fsdp": (["--use_fsdp"], {"launcher": "multi_gpu", "nproc": "2", "ACCELERATE_USE_FSDP": "true"}),
    "multi-gpu": (["--multi_gpu"], {"launcher": "multi_gpu", "nproc": "2", "ACCELERATE_USE_FSDP": None}),
    "cpu": (["--cpu"], {"launcher": "simple", "ACCELERATE_USE_CPU": "True"}),
    "two-machines": (
        [*MACHINE, "--machine_rank", "0", "--gpu_ids", "0"],
        {"launcher": "multi_gpu", "nproc": "1", "nnodes": "2", "{mask}": "0"},
    ),
    "config-deepspeed": (
        ["--config_file", "{deepspeed.yaml}"],
        {"launcher": "deepspeed", "nproc": "2", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2"},
    ),
    "config-fsdp": (
        ["--config_file", "{fsdp.yaml}"],
        {"launcher": "multi_gpu", "nproc": "2", "ACCELERATE_USE_FSDP": "true"},
    ),
}

#: Flags accelerate itself refuses together: its message, before the registry decides anything.
REFUSED = {
    "deepspeed-and-multi-gpu": (["--use_deepspeed", "--multi_gpu"], "only use one of"),
    "fsdp-and-deepspeed": (["--use_fsdp", "--use_deepspeed"], "only use one of"),
    "multi-gpu-one-process": (["--multi_gpu", "--num_processes", "1"], "at least 2 processes"),
}

BACKENDS = [pytest.param(n, marks=pytest.mark.accelreg_emu(name=n, devices=2)) for n in NAMES]


@pytest.fixture
def launch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """``decide(argv)``: accelerate's ``launch_command`` on ``argv + [script]`` with the launcher
    seam on and no default config file; returns what the chosen launcher prepared."""
    import accelerate.commands.launch as stock

    from accelreg.integrations.accelerate import launch as seam

    monkeypatch.setattr(stock, "default_config_file", str(tmp_path / "no-default-config.yaml"))
    seam.enable()
    chosen: dict[str, Any] = {}

    def recorder(kind: str, prepare: Any) -> Any:
        def launcher(args: Any) -> None:
            out = prepare(args)
            env = out[1] if isinstance(out, tuple) else out
            chosen.update(launcher=kind, args=args, env=env)

        return launcher

    monkeypatch.setattr(stock, "deepspeed_launcher", recorder("deepspeed", stock.prepare_deepspeed_cmd_env))
    monkeypatch.setattr(stock, "multi_gpu_launcher", recorder("multi_gpu", stock.prepare_multi_gpu_env))
    monkeypatch.setattr(stock, "simple_launcher", recorder("simple", stock.prepare_simple_launcher_cmd_env))

    def decide(argv: list[str]) -> dict[str, Any]:
        chosen.clear()
        # port 0: a free one (a port in use stops a machine of several before anything starts)
        args = stock.launch_command_parser().parse_args(["--main_process_port", "0", *argv, "train.py"])
        stock.launch_command(args)
        return dict(chosen)

    yield decide
    seam.disable()


def _fill(value: Any, files: dict[str, str], mask: str) -> Any:
    if not isinstance(value, str):
        return value
    for key, path in files.items():
        value = value.replace("{" + key + "}", path)
    return value.replace("{mask}", mask)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("mode", list(DECISIONS))
def test_each_mode_is_decided_as_accelerate_decides_it_with_the_registrys_devices(
    name: str, mode: str, launch: Any, tmp_path: Path
) -> None:
    """Each mode flag and config-file mode, with the registry's two devices and no accelerate
    config: the launcher accelerate runs for it, its processes (the registry's count where no
    flag gives one), and the variables that tell the ranks the mode."""
    files = _files(tmp_path / "files")
    argv, want = DECISIONS[mode]
    got = launch([_fill(a, files, MASKS[name]) for a in argv])
    assert got, f"{mode}: no launcher was chosen"
    args, env = got["args"], got["env"]
    for key, value in want.items():
        value, key = _fill(value, files, MASKS[name]), _fill(key, files, MASKS[name])
        if key == "launcher":
            assert got["launcher"] == value, (mode, got["launcher"])
        elif key == "processes":
            assert args.num_processes == value, (mode, args.num_processes)
        elif key in ("nproc", "nnodes"):
            attr = "nproc_per_node" if key == "nproc" else "nnodes"
            assert str(getattr(args, attr, None)) == value, (mode, key, vars(args))
        else:
            assert env.get(key) == value, (mode, key, env.get(key))
    if got["launcher"] != "simple":
        assert not args.cpu and "ACCELERATE_USE_CPU" not in env, (mode, vars(args))


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("mode", list(REFUSED))
def test_flags_accelerate_refuses_together_are_refused_with_its_own_message(
    name: str, mode: str, launch: Any
) -> None:
    argv, message = REFUSED[mode]
    with pytest.raises(ValueError, match=message):
        launch(argv)


# -- the launches ----------------------------------------------------------------------------
#: name -> (accelerate launch options, machines). A job of two machines is two launches on
#: localhost, machine r on physical device r (``--gpu_ids r``), one process each.
LAUNCHES: dict[str, tuple[tuple[str, ...], int]] = {
    "deepspeed": (("--use_deepspeed",), 1),
    "deepspeed-zero2": (("--use_deepspeed", "--zero_stage", "2", "--num_processes", "2"), 1),
    "deepspeed-config": (("--use_deepspeed", "--deepspeed_config_file", "{ds}"), 1),
    "deepspeed-standard": (
        ("--use_deepspeed", "--deepspeed_multinode_launcher", "standard", "--zero_stage", "2"),
        2,
    ),
    "fsdp": (("--use_fsdp",), 1),
    "multi-gpu": (("--multi_gpu",), 1),
    "cpu": (("--cpu",), 1),
    "machines": ((), 2),
}
#: What each launch's ranks say: distributed type (None: the backend's multi-process type), ZeRO
#: stage (accelerate's default is 2; the config file says 1), and the cpu runs whose trained model
#: theirs equals: accelerate gives DeepSpeed a gradient clipping of 1.0 (``clipped``: the cpu run
#: clips the same), the others clip nothing. Beside a DeepSpeed config file that sets none,
#: accelerate 1.16 fills in 1.0 and 1.10 leaves it unset: either run (``plain|clipped``).
EXPECT: dict[str, tuple[str | None, int | None, str]] = {
    "deepspeed": ("DEEPSPEED", 2, "clipped"),
    "deepspeed-zero2": ("DEEPSPEED", 2, "clipped"),
    "deepspeed-config": ("DEEPSPEED", 1, "plain|clipped"),
    "deepspeed-standard": ("DEEPSPEED", 2, "clipped"),
    "fsdp": ("FSDP", None, "plain"),
    "multi-gpu": (None, None, "plain"),
    "machines": (None, None, "plain"),
}
MULTI = {"emu": "MULTI_GPU", "npu": "MULTI_NPU"}  # accelerate's type for a backend it knows


def _environ(name: str | None, work: Path, **extra: str) -> dict[str, str]:
    """The launch tests' machine (``test_accelerate_launch._environ``), without dynamo."""
    return _launch_environ(name, work, TORCHDYNAMO_DISABLE="1", **extra)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Job]:
    root = tmp_path_factory.mktemp("accelerate-modes")
    files = _files(root / "files")
    run = [sys.executable, "-m", "accelreg", "run", "--"]
    waves: list[dict[str, tuple[list[str], dict[str, str], Path]]] = []
    for name in NAMES:
        wave: dict[str, tuple[list[str], dict[str, str], Path]] = {}
        for mode, (options, machines) in LAUNCHES.items():
            opts = [_fill(o, files, "") for o in options]
            out = root / f"{name}-{mode}"
            if machines == 1:
                argv = _accelerate("launch", "--main_process_port", str(free_port()), *opts)
                wave[f"{name}-{mode}"] = ([*run, *argv, TRAIN, str(out)], _environ(name, root), out)
            else:
                port = str(free_port())
                for r in range(machines):
                    argv = _accelerate(
                        "launch", *MACHINE, "--main_process_port", port, "--machine_rank", str(r)
                    )
                    argv += [*opts, "--gpu_ids", str(r), TRAIN, str(out)]
                    wave[f"{name}-{mode}-{r}"] = (
                        [*run, *argv],
                        _environ(name, root),
                        root / f"{name}-{mode}-{r}",
                    )
            if len(wave) >= 3:  # three launches at a time (two machines of one job together)
                waves.append(wave)
                wave = {}
        if wave:
            waves.append(wave)
    env = _environ(None, root, ACCELERATE_USE_CPU="true", ACCELERATE_MIXED_PRECISION="no")
    for reference, extra in (("plain", ()), ("clipped", ("--clip", "1.0"))):
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
        argv += ["--master-port", str(free_port()), TRAIN, str(root / reference), *extra]
        waves[0][reference] = (argv, env, root / reference)
    done: dict[str, Job] = {}
    for wave in waves:
        done.update(run_jobs(wave, timeout=TIMEOUT))
    for name in NAMES:  # a job of two machines: both write their rank into the job's folder
        for mode, (_, machines) in LAUNCHES.items():
            if machines > 1:
                folder = root / f"{name}-{mode}"
                parts = [done.pop(f"{name}-{mode}-{r}") for r in range(machines)]
                records = [json.loads(f.read_text()) for f in sorted(folder.glob("rank*.json"))]
                failed = [p for p in parts if p.returncode != 0]
                done[f"{name}-{mode}"] = Job(
                    f"{name}-{mode}",
                    failed[0].returncode if failed else 0,
                    "".join(p.describe() for p in parts),
                    records,
                )
    return done


def _flat(params: list[Any]) -> list[float]:
    out: list[float] = []
    for p in params:
        if isinstance(p, list):
            out += _flat(p)
        else:
            out.append(float(p))
    return out


def _reference(jobs: dict[str, Job], reference: str) -> list[float]:
    ranks = jobs[reference].ranks(2)
    assert ranks[0]["distributed_type"] == "MULTI_CPU" and ranks[0]["all_reduce"] == 2.0, ranks[0]
    return _flat(ranks[0]["full"])


def _close(mine: list[float], want: list[float]) -> bool:
    return len(mine) == len(want) and all(abs(a - b) <= 1e-5 for a, b in zip(mine, want, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mode", [m for m in LAUNCHES if m != "cpu"])
def test_each_mode_trains_rank_r_on_device_r_with_the_registrys_collectives(
    jobs: dict[str, Job], name: str, mode: str
) -> None:
    kind, stage, reference = EXPECT[mode]
    machines = LAUNCHES[mode][1]
    ranks = jobs[f"{name}-{mode}"].ranks(2)
    for r, rank in enumerate(ranks):
        local = 0 if machines > 1 else r
        assert rank["device"] == f"{name}:{local}" and rank["param_devices"] == [f"{name}:{local}"], rank
        assert rank["processes"] == 2 and rank["local_rank"] == local and rank["accelerator"] == name, rank
        assert rank["distributed_type"] == (kind or MULTI[name]), rank
        assert rank["zero_stage"] == stage and rank["process_group"] == COLLECTIVES[name], rank
        assert rank["all_reduce"] == 2.0 and rank["gather"] == [0, 1] and rank["reduce"] == 2.0, rank
        assert rank["restored"] and rank["matmul"] == "torch.float32", rank
        if machines > 1:  # machine r on physical device r, under the backend's own mask
            assert rank["masks"] == {MASKS[name]: str(r)} and rank["emulated_visible"] == [r], rank
        else:
            assert rank["masks"] == {} and rank["emulated_visible"] == [0, 1], rank
    trained = _flat(ranks[0]["full"])
    assert any(_close(trained, _reference(jobs, ref)) for ref in reference.split("|")), (
        f"the trained model differs from the {reference} cpu run (largest difference from each: "
        + ", ".join(
            f"{ref} {max(abs(a - b) for a, b in zip(trained, _reference(jobs, ref), strict=True)):.2e}"
            for ref in ("plain", "clipped")
        )
        + ")"
    )
    if name != NAMES[0]:  # a name accelerate knows and one it has never heard of: the same numbers
        assert trained == _flat(jobs[f"{NAMES[0]}-{mode}"].ranks(2)[0]["full"]), (
            f"{name} and {NAMES[0]} differ"
        )


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_cpu_asked_for_runs_one_process_on_the_cpu(jobs: dict[str, Job], name: str) -> None:
    """``--cpu``: accelerate's simple launcher, one process, on the cpu although the registry
    has two devices of ``name`` (the rank asked for it: ``ACCELERATE_USE_CPU``)."""
    (rank,) = jobs[f"{name}-cpu"].ranks(1)
    assert rank["device"] == "cpu" and rank["param_devices"] == ["cpu"], rank
    assert rank["distributed_type"] == "NO" and rank["processes"] == 1 and rank["restored"], rank
