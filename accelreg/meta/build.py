"""Build a transformers model on the meta device: no weights, no download, no remote code.

:func:`build_meta_model` makes an empty model from a model type (``"gpt2"``: its default
config), a config object, a ``config.json`` or a folder holding one (a checkpoint folder), with
the head a task (:data:`TASKS`) or a model class names.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import MetaModelError

__all__ = ["DEFAULT_TASKS", "HF_LIBRARIES", "TASKS", "build_meta_model", "tasks_for"]

#: What building a model from its config imports: the ``hf`` extra (``pip install 'accelreg[hf]'``).
HF_LIBRARIES = ("transformers", "accelerate", "huggingface_hub", "tokenizers", "safetensors")

#: The heads a model can be built with: task -> (transformers Auto class, the mapping of model
#: types to model class names in ``transformers.models.auto.modeling_auto`` that it reads).
TASKS: dict[str, tuple[str, str]] = {
    "causal-lm": ("AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    "seq2seq-lm": ("AutoModelForSeq2SeqLM", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
    "masked-lm": ("AutoModelForMaskedLM", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
    "sequence-classification": (
        "AutoModelForSequenceClassification",
        "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    ),
    "token-classification": (
        "AutoModelForTokenClassification",
        "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
    ),
    "question-answering": ("AutoModelForQuestionAnswering", "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES"),
    "image-text-to-text": ("AutoModelForImageTextToText", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES"),
    "pretraining": ("AutoModelForPreTraining", "MODEL_FOR_PRETRAINING_MAPPING_NAMES"),
    "base": ("AutoModel", "MODEL_MAPPING_NAMES"),
}
#: What is tried, in order, when no task or class is chosen.
DEFAULT_TASKS = ("causal-lm", "seq2seq-lm", "base")
#: Hub ids are split into words at these characters (``Qwen2.5-7B-Instruct``).
_WORD_BREAKS = re.compile(r"[-_.\s]+")


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    import transformers

    previous = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(previous)


def _first_line(exc: BaseException, limit: int = 200) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _cause(exc: BaseException) -> str:
    """The first line of the innermost cause: huggingface_hub's validation errors wrap the
    ``TypeError`` that says what is wrong."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return _first_line(exc)


def _model_types() -> list[str]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return list(CONFIG_MAPPING.keys())


def _guess_types(spec: str, types: list[str]) -> tuple[list[str], list[str], bool]:
    """``(model types spec most likely means, those named by its words, whether spec looks
    like a Hub id)``.

    A Hub id loses its ``org/`` and is split into words (``Llama-2-7b-hf`` -> llama, 2, 7b,
    hf); a run of words from the first or second one, joined by ``_``, ``-`` or nothing, that
    is a model type is a match (``gpt2-medium`` -> gpt2, ``Phi-3-mini`` -> phi3,
    ``flan-t5-base`` -> t5), the longest first. Close spellings (difflib) follow."""
    known = set(types)
    name = spec.strip().rstrip("/").rsplit("/", 1)[-1]
    words = [w for w in _WORD_BREAKS.split(name.lower()) if w]
    found: list[str] = []
    whole = False  # every word is the type's name: a spelling of it (gpt-2, GPT2), not a Hub id
    for length in range(min(len(words), 4), 0, -1):
        for start in range(min(2, len(words) - length + 1)):
            for joiner in ("_", "-", ""):
                candidate = joiner.join(words[start : start + length])
                if candidate in known and candidate not in found:
                    found.append(candidate)
                    whole = whole or (length == len(words) and len(found) == 1)
    hub_like = "/" in spec or (bool(found) and not whole)
    if whole and not hub_like:
        return found[:1], found, False  # gpt-2: gpt2 (and not also gptj, seggpt, ...)
    close = difflib.get_close_matches(name.lower(), types, n=5)
    if words:
        close += difflib.get_close_matches(words[0], types, n=3)
    guesses = found + [c for c in dict.fromkeys(close) if c not in found]
    return guesses[:5], found, hub_like


def _not_found(spec: str) -> MetaModelError:
    import transformers

    guesses, found, hub_like = _guess_types(spec, _model_types())
    what = f"{spec!r} is not a model type of transformers {transformers.__version__}, nor a config.json or a folder"
    offline = "to plan a Hub model offline, pass the path of its config.json or of a folder holding one"
    if hub_like:
        offline += f" (`hf download {spec.strip()} config.json` fetches it; accelreg downloads nothing)"
    if hub_like and found:
        also = f" (or {', '.join(found[1:3])})" if len(found) > 1 else ""
        return MetaModelError(
            f"{what}; it looks like a Hub id of a {found[0]} model{also}: {found[0]!r} alone plans that "
            f"type's default config, not necessarily this model's size; {offline}"
        )
    hint = f" (did you mean {', '.join(guesses)}?)" if guesses else ""
    return MetaModelError(f"{what}{hint}; {offline}")


def _read_config_json(file: Path, shown: str) -> None:
    """Check a config.json before transformers reads it, for a one-line error."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise MetaModelError(f"cannot read {shown}: {_first_line(exc)}") from None
    except json.JSONDecodeError as exc:
        raise MetaModelError(f"{shown} is not JSON ({exc.msg}, line {exc.lineno})") from None
    model_type = data.get("model_type") if isinstance(data, dict) else None
    if not isinstance(model_type, str):
        raise MetaModelError(f"{shown} has no model_type: is it a transformers config.json?")
    if model_type not in CONFIG_MAPPING:
        import transformers

        if isinstance(data.get("auto_map"), dict):
            raise MetaModelError(
                f"{shown}: model type {model_type!r} needs the repository's own code (auto_map), which "
                "accelreg never runs"
            )
        close = difflib.get_close_matches(model_type, _model_types(), n=3)
        hint = f" (close: {', '.join(close)})" if close else ""
        raise MetaModelError(
            f"{shown}: model type {model_type!r} is not in transformers {transformers.__version__}{hint}"
        )
    _check_values(data, CONFIG_MAPPING[model_type], shown)


#: The sizes that shape every transformers model, by the names transformers gives them everywhere
#: (a config class maps its own onto them with ``attribute_map``: gpt2's ``n_embd`` is
#: ``hidden_size``). Each must be a positive int where a config.json sets it.
_SHAPE = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "max_position_embeddings",
    "head_dim",
)


def _check_values(data: dict[str, Any], config_class: Any, shown: str) -> None:
    """Refuse, before transformers builds anything, the values of a config.json no model can be
    built from: a shape size that is not a positive int (``"vocab_size": "big"``), text or a bool
    where the type's default is a number, a hidden size the attention heads do not divide."""
    try:
        default = config_class()
    except Exception:  # noqa: BLE001 - a type without a default config: only the shape is checked
        default = None
    own = dict(getattr(config_class, "attribute_map", None) or {})  # canonical name -> this type's
    canonical = {name: key for key, name in own.items()}

    def value(key: str) -> Any:
        name = own.get(key, key)
        if name in data:
            return data[name]
        return data[key] if key in data else getattr(default, name, None)

    for key, given in data.items():
        expected = getattr(default, key, None)
        if canonical.get(key, key) in _SHAPE:
            if given is None or (isinstance(given, int) and not isinstance(given, bool) and given > 0):
                continue
            raise MetaModelError(f"{shown}: {key} is {_short(given)}; it must be a positive integer")
        number = isinstance(expected, (int, float)) and not isinstance(expected, bool)
        if number and isinstance(given, (str, bool)):
            raise MetaModelError(
                f"{shown}: {key} is {_short(given)}, not a number (the default is {expected!r})"
            )
    hidden, heads = value("hidden_size"), value("num_attention_heads")
    if (
        isinstance(hidden, int)
        and isinstance(heads, int)
        and heads > 0
        and hidden % heads
        and data.get(own.get("head_dim", "head_dim")) is None  # a default head_dim is derived from them
    ):
        raise MetaModelError(
            f"{shown}: {own.get('hidden_size', 'hidden_size')} ({hidden}) is not a multiple of "
            f"{own.get('num_attention_heads', 'num_attention_heads')} ({heads}), the number of attention heads"
        )


def _short(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (str, bool)) or value is None else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _config_for(spec: Any) -> tuple[Any, str]:
    from transformers import AutoConfig, PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if isinstance(spec, PretrainedConfig):
        return spec, f"{type(spec).__name__} ({spec.model_type})"
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str):
        raise TypeError(
            "expected a model on meta, a transformers config, a model type, a config.json or a folder "
            f"holding one, got {type(spec).__name__}"
        )
    if not spec.strip():
        raise MetaModelError("the model is empty: give a model type, a config.json or a folder holding one")
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        file = path / "config.json"
    elif path.is_file():
        file = path
    elif spec in CONFIG_MAPPING:  # a model type, even where a folder of that name lacks a config
        return AutoConfig.for_model(spec), f"{spec} (default config)"
    elif path.is_dir():
        raise MetaModelError(f"{spec!r} is a folder without a config.json")
    elif spec.startswith((".", "/", "~", "\\")) or spec.lower().endswith(".json"):
        raise MetaModelError(f"{spec!r}: no such file or folder")
    else:
        raise _not_found(spec)
    _read_config_json(file, repr(spec))
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - transformers' own validation (strict dataclasses in 5.x), one line
        raise MetaModelError(f"transformers cannot read {spec!r}: {_cause(exc)}") from None
    return config, f"{spec} ({config.model_type})"


def _normal_task(task: str) -> str:
    key = task.strip().lower().replace("_", "-") if isinstance(task, str) else task
    if key not in TASKS:
        raise MetaModelError(f"unknown task {task!r}; one of: {', '.join(TASKS)}")
    return key


def _class_names(task: str, model_type: str) -> tuple[str, ...]:
    from transformers.models.auto import modeling_auto

    names = getattr(modeling_auto, TASKS[task][1], {}).get(model_type, ())
    return (names,) if isinstance(names, str) else tuple(names)


def tasks_for(config: Any) -> list[str]:
    """The tasks of :data:`TASKS` that transformers has a model class for, for ``config`` (a
    config object or a model type): ``tasks_for("bert")`` -> ``["causal-lm", "masked-lm", ...]``."""
    model_type = config if isinstance(config, str) else config.model_type
    return [task for task in TASKS if _class_names(task, model_type)]


def _model_class(given: Any, config: Any) -> Any:
    """The transformers model class ``given`` (a class or its name), checked against ``config``."""
    import transformers

    model_type = config.model_type
    known = sorted({n for t in TASKS for n in _class_names(t, model_type)})
    listed = (
        f"classes for {model_type}: {', '.join(known)}" if known else f"no class is mapped for {model_type}"
    )
    cls = given
    if isinstance(given, str):
        try:
            cls = getattr(transformers, given, None)
        except Exception as exc:  # noqa: BLE001 - a class failing to import is a one-line error
            raise MetaModelError(f"transformers cannot import {given}: {_first_line(exc)}") from None
        if cls is None:
            close = difflib.get_close_matches(given, known, n=3) or difflib.get_close_matches(
                given, [n for n in dir(transformers) if n[:1].isupper()], n=3
            )
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise MetaModelError(
                f"transformers {transformers.__version__} has no class {given!r}{hint} ({listed})"
            )
    name = getattr(cls, "__name__", repr(given))
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
        auto = "; an Auto class is chosen with a task" if name.startswith("AutoModel") else ""
        raise MetaModelError(f"{name!r} is not a transformers model class{auto} ({listed})")
    wanted = getattr(cls, "config_class", None)
    if name.endswith("PreTrainedModel") or wanted in (None, transformers.PretrainedConfig):
        # the abstract base of a model family (BertPreTrainedModel) has no layers to plan
        raise MetaModelError(f"{name} is an abstract base class, not a model ({listed})")
    if isinstance(wanted, type) and not isinstance(config, wanted):
        kind = getattr(wanted, "model_type", "") or wanted.__name__
        raise MetaModelError(f"{cls.__name__} builds {kind} models, not {model_type} ({listed})")
    return cls


def _build(make: Any, source: str, what: str, passes: tuple[type[BaseException], ...] = ()) -> Any:
    """``make()`` on the meta device; its errors (but ImportError and ``passes``) as one line."""
    import torch

    try:
        with torch.device("meta"):
            return make()
    except (ImportError, *passes):
        raise
    except Exception as exc:  # noqa: BLE001 - a config transformers cannot build is a one-line error
        raise MetaModelError(f"transformers cannot build {source} as {what}: {_first_line(exc)}") from None


def build_meta_model(spec: Any, *, task: str | None = None, model_class: Any = None) -> tuple[Any, str]:
    """``(model on meta, what was built)`` for a model type, a config object, a ``config.json``
    or a folder holding one; remote code is never run, nothing is downloaded.

    Args:
        spec: ``"gpt2"`` (that type's default config), a ``PretrainedConfig``, or the path of
            a ``config.json`` or of a folder holding one.
        task: The head, a key of :data:`TASKS` (``"masked-lm"``: ``AutoModelForMaskedLM``).
        model_class: A transformers model class, or its name (``"BertForMaskedLM"``).

    Without either, ``AutoModelForCausalLM``, else ``AutoModelForSeq2SeqLM``, else ``AutoModel``.
    Raises :class:`MetaModelError` (a ``ValueError``, one line) for what cannot be built,
    ``ImportError`` when the build needs a module that is not installed (for transformers and
    the other libraries of the ``hf`` extra, a ``ModuleNotFoundError`` that says to install
    ``accelreg[hf]``)."""
    try:
        return _build_meta_model(spec, task, model_class)
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".", 1)[0]
        if top not in HF_LIBRARIES:
            raise
        raise ModuleNotFoundError(
            f"building {_shown(spec)} needs {top}, which is not installed (pip install 'accelreg[hf]')",
            name=exc.name,
        ) from exc


def _shown(spec: Any) -> str:
    if isinstance(spec, (str, os.PathLike)):
        return repr(os.fspath(spec))
    return type(spec).__name__


def _build_meta_model(spec: Any, task: str | None, model_class: Any) -> tuple[Any, str]:
    import transformers

    if task is not None and model_class is not None:
        raise MetaModelError("give a task or a model class, not both")
    with _quiet_transformers():
        config, source = _config_for(spec)
        if model_class is not None:
            cls = _model_class(model_class, config)
            model = _build(lambda: cls._from_config(config), source, cls.__name__)
            return model, f"{source} as {type(model).__name__}"
        tasks = [_normal_task(task)] if task is not None else list(DEFAULT_TASKS)
        errors = []
        for name in tasks:
            auto = getattr(transformers, TASKS[name][0], None)
            if auto is None or (task is not None and not _class_names(name, config.model_type)):
                available = ", ".join(tasks_for(config)) or "none"
                raise MetaModelError(
                    f"transformers {transformers.__version__} has no {name} model for {config.model_type} "
                    f"(its tasks: {available})"
                )
            try:
                model = _build(lambda auto=auto: auto.from_config(config), source, name, (ValueError,))
            except ValueError as exc:  # this auto class has no mapping for the config
                errors.append(f"{auto.__name__}: {_first_line(exc)}")
                continue
            return model, f"{source} as {type(model).__name__}"
    raise MetaModelError(f"transformers cannot build {source}: " + "; ".join(errors))
