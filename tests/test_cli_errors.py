"""The ``accelreg`` command's manners (issue 31): every error is one line on stderr with a stable
exit code, a mistyped name gets "did you mean", and ``accelreg plan`` checks every value it is
given (flags, a config.json) before it builds anything. In-process, through
``accelreg.cli.main``; ``accelreg run`` is tests/test_cli_faults.py's."""

from __future__ import annotations

import json
import sys

import pytest

from accelreg import cli

from ._planner_support import quiet


@pytest.fixture(autouse=True)
def _quiet():
    quiet()


def usage_error(capsys, argv: list[str]) -> str:
    """argparse's refusal of ``argv``: exit 2, the usage, then one ``error:`` line."""
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1].count("error:") == 1, err
    return err


@pytest.fixture
def not_built(monkeypatch):
    """Fails the test if ``accelreg plan`` gets as far as building the model."""
    monkeypatch.setattr(
        "accelreg.cli.plan.build_meta_model", lambda *a, **k: pytest.fail("the model was built")
    )


@pytest.fixture
def not_constructed(monkeypatch):
    """Fails the test if transformers is asked to construct the model (its config was read)."""
    monkeypatch.setattr(
        "accelreg.meta.build._build", lambda *a, **k: pytest.fail("the model was constructed")
    )


# -- mistyped commands, options and choices ----------------------------------------------------
def test_a_mistyped_command_gets_did_you_mean(capsys):
    err = usage_error(capsys, ["evn"])
    assert "invalid choice: 'evn'" in err and "(did you mean 'env'?)" in err


def test_a_mistyped_option_shows_the_commands_usage_and_did_you_mean(capsys):
    err = usage_error(capsys, ["plan", "gpt2", "--max-memry", "npu:0=1GB"])
    assert err.startswith("usage: accelreg plan ") and "usage: accelreg [-h]" not in err
    assert (
        "accelreg plan: error: unrecognized arguments: --max-memry npu:0=1GB (did you mean '--max-memory'?)"
        in err
    )
    # alone, it would leave MODEL missing: the typo is what is reported, with plan's usage
    err = usage_error(capsys, ["plan", "--max-memry"])
    assert err.startswith("usage: accelreg plan ") and "did you mean '--max-memory'?" in err
    assert "--jsn (did you mean '--json'?)" in usage_error(capsys, ["env", "--jsn"])
    assert "--verison (did you mean '--version'?)" in usage_error(capsys, ["--verison"])


def test_a_mistyped_choice_gets_did_you_mean(capsys):
    err = usage_error(capsys, ["plan", "gpt2", "--strategy", "balancd"])
    assert "invalid choice: 'balancd'" in err and "did you mean 'balanced'" in err


@pytest.mark.parametrize(
    ("command", "needle"),
    [
        ("config", "where it came from (an argument, an ACCELREG_* variable"),
        ("resolve", "as accelreg.resolve(SPEC)"),
    ],
)
def test_config_and_resolve_have_a_description(capsys, command, needle):
    with pytest.raises(SystemExit) as stop:
        cli.main([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert stop.value.code == 0 and needle in out and "Exit codes:" in out


def test_config_writes_its_errors_to_stderr(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "accelreg.toml").write_text("priority = [\n")
    assert cli.main(["config"]) == cli.EXIT_CONFIG
    out, err = capsys.readouterr()
    assert "malformed TOML" not in out and "setting" in out
    assert err.startswith("accelreg config: error (file skipped): ") and "malformed TOML" in err
    assert cli.main(["config", "--json"]) == cli.EXIT_CONFIG
    out, err = capsys.readouterr()
    assert json.loads(out)["errors"] and "malformed TOML" in err


@pytest.mark.parametrize("where", ["ACCELREG_CONFIG", "project", "user"])
def test_config_names_a_directory_given_as_a_configuration_file(where, tmp_path, monkeypatch, capsys):
    folder = {
        "ACCELREG_CONFIG": tmp_path / "settings",
        "project": tmp_path / "accelreg.toml",
        "user": tmp_path / "xdg" / "accelreg" / "config.toml",
    }[where]
    folder.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    if where == "ACCELREG_CONFIG":
        monkeypatch.setenv("ACCELREG_CONFIG", str(folder))
    assert cli.main(["config"]) == cli.EXIT_CONFIG
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{folder}: is a directory, not a file; " in err and "a TOML file" in err, err
    assert "no such file" not in err


# -- accelreg plan: flags before anything is built -------------------------------------------
@pytest.mark.parametrize(
    ("budget", "needle"),
    [
        ("npu:0=lots", "--max-memory npu:0: 'lots' is not a size"),
        ("npu0=1GB", "'npu0' is not a backend accelreg knows (did you mean 'npu:0'?)"),
        ("gpu:0=1GB", "'gpu:0' is not a backend accelreg knows (did you mean 'cuda:0' or 'xpu:0'?)"),
        ("NPU:0=1GB", "'NPU:0' is not a device (did you mean 'npu:0'?)"),
        ("nup:1=1GB", "(did you mean 'npu:1'?)"),
        ("cpu:1=1GB", "'cpu:1': cpu has no index"),
        ("npu:0=1GB,npu:0=2GB", "twice"),
        ("npu:0=1Gb", "ambiguous"),
    ],
)
def test_a_bad_budget_is_refused_before_torch_is_imported(capsys, monkeypatch, not_built, budget, needle):
    monkeypatch.setitem(sys.modules, "torch", None)  # any `import torch` from here on fails
    assert cli.main(["plan", "gpt2", "--max-memory", budget]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("accelreg plan: ") and needle in err, err
    if "backend" in needle:  # names what there is
        assert "the backends registered here: cuda, " in err and "cpu and disk" in err


def test_a_bad_dtype_search_limit_or_plot_folder_is_refused_before_the_build(capsys, not_built, tmp_path):
    assert cli.main(["plan", "gpt2", "--dtype", "fp61"]) == cli.EXIT_USAGE
    assert "unknown dtype 'fp61' (did you mean 'fp64' or 'fp16'?)" in capsys.readouterr().err
    assert "not a positive number of nodes" in usage_error(capsys, ["plan", "gpt2", "--search-limit", "0"])
    missing = str(tmp_path / "no" / "plan.png")
    assert cli.main(["plan", "gpt2", "--plot", missing]) == cli.EXIT_USAGE
    assert "the folder to write it in does not exist" in capsys.readouterr().err


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    """config.json files a user might hand ``accelreg plan``: small, and broken in one value."""
    root = tmp_path_factory.mktemp("configs")
    small = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4}
    files = {
        "small": small,
        "heads": {
            "model_type": "llama",
            "hidden_size": 4095,
            "num_attention_heads": 32,
            "num_hidden_layers": 2,
        },
        "gpt2_heads": {**small, "n_embd": 4095, "n_head": 32},
        "vocab": {**small, "vocab_size": "big"},
        "layers": {**small, "n_layer": 0},
        "epsilon": {**small, "layer_norm_epsilon": "tiny"},
        "t5_head_dim": {"model_type": "t5", "d_model": 100, "num_heads": 8, "d_kv": 16, "num_layers": 1},
    }
    for name, data in files.items():
        (root / f"{name}.json").write_text(json.dumps(data), encoding="utf-8")
    return root


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("heads", "hidden_size (4095) is not a multiple of num_attention_heads (32)"),
        ("gpt2_heads", "n_embd (4095) is not a multiple of n_head (32)"),
        ("vocab", 'vocab_size is "big"; it must be a positive integer'),
        ("layers", "n_layer is 0; it must be a positive integer"),
        ("epsilon", 'layer_norm_epsilon is "tiny", not a number (the default is 1e-05)'),
    ],
)
def test_a_config_json_with_a_bad_value_is_one_line_before_the_build(
    configs, capsys, not_constructed, name, needle
):
    path = str(configs / f"{name}.json")
    assert cli.main(["plan", path, "--max-memory", "cpu=1GB"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"accelreg plan: {path!r}: {needle}"), err


def test_a_head_dim_of_its_own_lets_heads_not_divide_the_hidden_size(configs, monkeypatch):
    class Reached(Exception):
        pass

    def construct(*args, **kwargs):
        raise Reached  # the values passed: transformers would construct the model now

    monkeypatch.setattr("accelreg.meta.build._build", construct)
    with pytest.raises(Reached):
        cli.main(["plan", str(configs / "t5_head_dim.json"), "--max-memory", "cpu=1GB"])


def test_a_mistyped_no_split_class_gets_did_you_mean(configs, capsys):
    args = ["plan", str(configs / "small.json"), "--max-memory", "cpu=1GB"]
    assert cli.main([*args, "--no-split", "GPT2Blok"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and "--no-split 'GPT2Blok': GPT2LMHeadModel has no module of that class" in err
    )
    assert "(did you mean 'GPT2Block'?); its default is GPT2Block" in err
    assert cli.main([*args, "--no-split", "GPT2Block,GPT2MLP"]) == cli.EXIT_OK
    capsys.readouterr()


@pytest.mark.parametrize(
    ("spec", "meant"), [("gpt-2", "gpt2"), ("GPT2", "gpt2"), ("Bert", "bert"), ("t-5", "t5")]
)
def test_a_misspelt_model_type_is_did_you_mean_not_a_hub_id(capsys, not_constructed, spec, meant):
    assert cli.main(["plan", spec]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"(did you mean {meant}?)" in err
    assert "Hub id" not in err and "hf download" not in err


# -- no traceback for bad input, anywhere -----------------------------------------------------
@pytest.mark.parametrize(
    "argv",
    [
        ["resolve", "npu:x"],
        ["resolve", "-1"],
        ["resolve", "99999999999999999999"],
        ["resolve", ""],
        ["resolve", "--backend", "gpu"],
        ["resolve", "disk"],
        ["plan", ""],
        ["plan", "/"],
        ["plan", "gpt2", "--task", "summarise"],
        ["plan", "gpt2", "--class", "Nope"],
        ["plan", "gpt2", "--max-memory", ","],
        ["plan", "gpt2", "--max-memory", "="],
        ["plan", "gpt2", "--max-memory", "cpu=-1GB"],
        ["plan", "gpt2", "--max-memory", "cpu=1e999GB"],
        ["plan", "gpt2", "--max-memory", "npu:0:1=1GB"],
    ],
)
def test_bad_input_is_one_line_and_a_stable_code(capsys, argv):
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code in (cli.EXIT_FAILED, cli.EXIT_USAGE), (code, err)
    assert err.count("\n") == 1 and err.startswith(f"accelreg{'' if argv[0] == 'resolve' else ' plan'}: "), (
        err
    )
