"""``accelreg plan``: as users run it (one subprocess), and in-process for the options."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from accelreg.cli import main

from ._planner_support import model_type, quiet, violations

README = ["plan", "gpt2", "--max-memory", "npu:0=250MB,npu:1=250MB,cpu=1GB"]


@pytest.fixture(autouse=True)
def _quiet():
    quiet()


def run_json(capsys, *args):
    code = main([*args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_the_readme_line_splits_gpt2_over_two_npus_and_the_cpu_in_a_subprocess():
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELREG_")}
    out = subprocess.run(
        [sys.executable, "-m", "accelreg", *README, "--json"], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    used = {p["place"]: p["used"] for p in data["places"]}
    assert all(used[p] > 0 for p in ("npu:0", "npu:1", "cpu"))
    budgets = {"npu:0": "250MB", "npu:1": "250MB", "cpu": "1GB"}
    assert violations(model_type("gpt2"), data["device_map"], budgets) == ()
    assert data["build_seconds"] > 0 and data["plan_seconds"] > 0


def test_text_output_shows_the_table_the_ranges_and_the_map(capsys):
    assert main(README) == 0
    text = capsys.readouterr().out
    assert "place" in text and "headroom" in text
    assert "transformer.h.2-9" in text  # layer ranges, not one line per block
    assert "device_map:" in text and "lm_head" in text
    assert "planned in" in text and "built on meta in" in text


def test_tiny_budgets_leave_gpt2_on_the_cpu_and_say_why(capsys):
    code, data = run_json(capsys, "plan", "gpt2", "--max-memory", "npu:0=60MB,npu:1=60MB,cpu=1GB")
    assert code == 0
    assert data["device_map"] == {"": "cpu"}
    assert any("headroom" in n for n in data["notes"])


def test_options_reach_the_planner(capsys):
    code, data = run_json(
        capsys, "plan", "gpt2", "--max-memory", "npu:0=1GB,npu:1=1GB", "--strategy", "sequential"
    )
    assert code == 0 and data["device_map"] == {"": "npu:0"}
    code, data = run_json(
        capsys, "plan", "gpt2", "--max-memory", "npu:0=300MB,npu:1=300MB", "--dtype", "bf16"
    )
    assert code == 0 and data["dtype"] == "bfloat16" and data["total"] == 124_439_808 * 2
    code, data = run_json(capsys, "plan", "gpt2", "--max-memory", "npu:0=1GB", "--quantization", "8bit")
    assert code == 0 and data["quantization"] == "bnb_8bit" and data["dtype"] == "float16"
    code, data = run_json(
        capsys, "plan", "gpt2", "--max-memory", "npu:0=100MB,npu:1=600MB", "--no-split", "GPT2Model"
    )
    assert code == 0 and data["device_map"] == {"": "npu:1"}


def test_without_max_memory_it_plans_for_this_machine(capsys):
    code, data = run_json(capsys, "plan", "gpt2")
    assert code == 0
    assert data["budget_source"] == "registry" and data["device_map"] == {"": "cpu"}


def test_a_local_config_directory(tmp_path, capsys):
    from transformers import GPT2Config

    GPT2Config(n_layer=2, n_embd=64, n_head=4).save_pretrained(tmp_path)
    code, data = run_json(capsys, "plan", str(tmp_path), "--max-memory", "npu:0=10MB,npu:1=10MB,cpu=1GB")
    assert code == 0 and "GPT2LMHeadModel" in data["built"]


def test_plots(tmp_path, capsys):
    for name in ("plan.png", "plan.svg"):
        assert main([*README, "--plot", str(tmp_path / name)]) == 0
        assert (tmp_path / name).stat().st_size > 1000
    capsys.readouterr()
    assert main([*README, "--plot", str(tmp_path / "plan.pdf")]) == 2
    assert "png or .svg" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["plan", "gpt3"], 2, "did you mean"),
        (["plan", "gpt2", "--max-memory", "npu:0"], 2, "DEVICE=SIZE"),
        (["plan", "gpt2", "--max-memory", "npu:0=1Gb"], 2, "ambiguous"),
        (["plan", "gpt2", "--max-memory", "npu:0=1GB,npu:0=2GB"], 2, "twice"),
        (["plan", "gpt2", "--max-memory", "0=1GB"], 1, "no accelerator"),
        (["plan", "gpt2", "--max-memory", "npu:0=10MB"], 1, "short by"),
        (["plan", "gpt2", "--max-memory", "npu:0=1GB", "--dtype", "fp13"], 2, "unknown dtype"),
    ],
)
def test_errors_have_stable_exit_codes(capsys, args, code, needle):
    assert main(args) == code
    assert needle in capsys.readouterr().err


def test_no_fit_in_json(capsys):
    code, data = run_json(capsys, "plan", "gpt2", "--max-memory", "npu:0=10MB")
    assert code == 1 and "short by" in data["error"] and data["violations"]


# -- what MODEL may be, and the head -------------------------------------------------------
SMALL = ["--max-memory", "npu:0=10MB,npu:1=10MB,cpu=1GB"]


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    """Small configs (two layers) and broken ones, as files a user would point at."""
    from transformers import BertConfig, GPT2Config

    root = tmp_path_factory.mktemp("specs")
    GPT2Config(n_layer=2, n_embd=64, n_head=4).save_pretrained(root / "gpt2")
    BertConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128
    ).save_pretrained(root / "bert")
    (root / "bad.json").write_text('{"model_type": "gpt2",', encoding="utf-8")
    (root / "untyped.json").write_text('{"hidden_size": 64}', encoding="utf-8")
    remote = {"model_type": "my_model", "auto_map": {"AutoConfig": "configuration_my.MyConfig"}}
    (root / "remote.json").write_text(json.dumps(remote), encoding="utf-8")
    (root / "empty").mkdir()
    return root


def test_a_config_json_file_plans_as_its_folder_does(specs, capsys):
    code, by_file = run_json(capsys, "plan", str(specs / "gpt2" / "config.json"), *SMALL)
    assert code == 0 and "GPT2LMHeadModel" in by_file["built"]
    code, by_folder = run_json(capsys, "plan", str(specs / "gpt2"), *SMALL)
    assert code == 0 and by_folder["device_map"] == by_file["device_map"]
    assert by_file["parameters"] == by_folder["parameters"] < 10_000_000  # its own config, not gpt2's default


@pytest.mark.parametrize(
    ("head", "built"),
    [
        ([], "BertLMHeadModel"),
        (["--task", "masked-lm"], "BertForMaskedLM"),
        (["--task", "sequence_classification"], "BertForSequenceClassification"),
        (["--class", "BertForMaskedLM"], "BertForMaskedLM"),
        (["--task", "base"], "BertModel"),
    ],
)
def test_task_or_class_chooses_the_head(capsys, head, built):
    code, data = run_json(capsys, "plan", "bert", *head, "--max-memory", "cpu=2GB")
    assert code == 0 and data["built"] == f"bert (default config) as {built}"
    assert data["device_map"] == {"": "cpu"}


def test_task_and_class_exclude_each_other_and_help_explains_them(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["plan", "bert", "--task", "masked-lm", "--class", "BertForMaskedLM"])
    assert stop.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(["plan", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert stop.value.code == 0
    for needle in ("config.json", "folder holding one", "Hub id", "--task TASK", "--class NAME", "masked-lm"):
        assert needle in text, needle


@pytest.mark.parametrize(
    ("spec", "model_type"),
    [
        ("openai-community/gpt2", "gpt2"),
        ("gpt2-medium", "gpt2"),
        ("bert-base-uncased", "bert"),
        ("meta-llama/Llama-2-7b-hf", "llama"),
    ],
)
def test_a_hub_id_names_its_model_type_and_how_to_plan_it_offline(capsys, spec, model_type):
    assert main(["plan", spec]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("accelreg plan: ")
    assert f"Hub id of a {model_type} model" in err and "openai-gpt" not in err
    assert "path of its config.json or of a folder holding one" in err
    assert f"hf download {spec} config.json" in err


@pytest.mark.parametrize(
    ("spec", "head", "needle"),
    [
        ("gpt5", [], "is not a model type of transformers"),
        ("openai-community/gpt2", [], "Hub id of a gpt2 model"),
        ("{root}/missing.json", [], "no such file or folder"),
        ("{root}/empty", [], "folder without a config.json"),
        ("{root}/bad.json", [], "is not JSON"),
        ("{root}/untyped.json", [], "has no model_type"),
        ("{root}/remote.json", [], "needs the repository's own code"),
        ("{root}/bert", ["--task", "summarise"], "unknown task 'summarise'; one of: causal-lm"),
        ("{root}/gpt2", ["--task", "masked-lm"], "has no masked-lm model for gpt2 (its tasks: causal-lm"),
        ("{root}/bert", ["--class", "BertForMaskedLn"], "did you mean BertForMaskedLM?"),
        ("{root}/bert", ["--class", "GPT2LMHeadModel"], "GPT2LMHeadModel builds gpt2 models, not bert"),
        ("{root}/bert", ["--class", "BertPreTrainedModel"], "abstract base class"),
        ("{root}/bert", ["--class", "AutoModelForMaskedLM"], "an Auto class is chosen with a task"),
    ],
)
def test_model_errors_are_one_line_and_exit_2(specs, capsys, spec, head, needle):
    args = ["plan", spec.format(root=specs), *head, *SMALL]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("accelreg plan: ") and needle in err, err
    assert "Traceback" not in err
    assert main([*args, "--json"]) == 2
    assert needle in json.loads(capsys.readouterr().out)["error"]


def test_device_map_for_takes_the_same_specs_and_heads(specs):
    import accelreg
    from accelreg.meta import TASKS, MetaModelError, tasks_for

    budgets = {"npu:0": "8.5MB", "npu:1": "8.5MB", "cpu": "1GB"}  # the model is split
    by_file = accelreg.device_map_for(specs / "bert" / "config.json", budgets, task="masked-lm")
    by_class = accelreg.device_map_for(str(specs / "bert"), budgets, model_class="BertForMaskedLM")
    assert by_file == by_class
    assert by_file["cls.predictions.decoder"] == by_file["bert.embeddings"]  # tied: one device
    base = accelreg.device_map_for(specs / "bert", budgets, task="base")
    assert len(set(base.values())) == 2 and not any(k.startswith(("bert", "cls")) for k in base)
    assert "masked-lm" in tasks_for("bert") and "masked-lm" not in tasks_for("gpt2")
    assert set(tasks_for("bert")) <= set(TASKS)
    with pytest.raises(MetaModelError, match="not both"):
        accelreg.device_map_for("bert", budgets, task="masked-lm", model_class="BertForMaskedLM")
    with pytest.raises(ValueError, match="Hub id of a bert model"):
        accelreg.device_map_for("google-bert/bert-base-uncased", budgets)
    from transformers import BertConfig, BertModel

    with torch_meta():
        model = BertModel(BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2))
    with pytest.raises(TypeError, match="head of a model built from a config"):
        accelreg.device_map_for(model, budgets, task="masked-lm")


def torch_meta():
    import torch

    return torch.device("meta")


def test_text_output_says_headroom_is_reserved_not_free(capsys):
    assert main(["plan", "gpt2", "--max-memory", "npu:0=200MB,npu:1=120MB,cpu=1GB"]) == 0
    assert "headroom: space reserved (not free)" in capsys.readouterr().out


# -- the plot ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "budgets",
    [
        "npu:0=200MB,npu:1=120MB,npu:2=120MB,cpu=60MB,disk=1GB",  # 3 devices, cpu, disk
        ",".join([f"npu:{i}=40MB" for i in range(1, 8)] + ["npu:0=170MB", "cpu=1GB"]),  # 8 devices
    ],
)
def test_the_plot_has_a_legend_and_no_label_overlaps_another(budgets):
    pytest.importorskip("matplotlib", reason="the plot needs the plot extra")
    from accelreg.cli.plan import parse_max_memory
    from accelreg.meta import build_meta_model
    from accelreg.planner import plan
    from accelreg.planner.plot import figure

    model, built = build_meta_model("gpt2")
    result = plan(model, parse_max_memory(budgets))
    fig = figure(result, title=built)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (ax,) = fig.axes
    legend = " ".join(t.get_text() for t in fig.legends[0].get_texts())
    assert "accelerator" in legend and "cpu" in legend and "budget" in legend
    assert "reserved (not free)" in legend  # the hatched headroom
    assert ("disk" in legend) == ("disk" in {u.place for u in result.places if u.used})
    labels = [t for t in ax.texts if "|" in t.get_text()]
    assert len(labels) == len(result.places)
    texts = [t.get_window_extent(renderer) for t in labels]
    texts += [t.get_window_extent(renderer) for t in ax.get_yticklabels()]
    bars = [p.get_window_extent(renderer) for p in ax.patches]
    legend_box = fig.legends[0].get_window_extent(renderer)
    for i, box in enumerate(texts):
        assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1  # nothing cut off
        assert not any(box.overlaps(other) for other in texts[i + 1 :]), labels[i % len(labels)].get_text()
        assert not any(box.overlaps(bar) for bar in bars)
        assert not box.overlaps(legend_box)
    axis = [t.get_window_extent(renderer) for t in [*ax.get_xticklabels(), ax.xaxis.label, ax.title]]
    assert not any(box.overlaps(legend_box) for box in [*bars, *axis])
