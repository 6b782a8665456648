"""``accelreg.install()`` never breaks the user's ``import`` (issue 10, item 3).

Each case runs in a fresh interpreter: ``install()``, then the user's own import line of a
library whose seam matches no adapter. The import must succeed, with one
:class:`~accelreg.integrations.IntegrationWarning` naming what is lost, and the library's other
seams on. Cases:

* a *patched fake release* of peft: a copy of the installed peft, first on ``PYTHONPATH``, whose
  ``infer_device`` has new code (what a future release looks like to accelreg);
* transformers, accelerate and DeepSpeed with one seam's known shapes replaced by one that
  matches nothing (the same situation without copying a 50 MB package);
* an integration whose enabling *raises* inside the import hook: before issue 10 this surfaced
  as ``ModuleNotFoundError: Could not import module 'GPT2LMHeadModel'``;
* strict mode: ``install()`` raises at the call; a failure recorded inside a hook in strict mode
  is raised by the next accelreg integration call, with its cause.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import textwrap
from pathlib import Path

import pytest

from accelreg.testing import run_python

# Every case runs in a child interpreter: this process needs the libraries installed, not imported.
for _library in ("transformers", "peft"):
    if importlib.util.find_spec(_library) is None:
        pytest.skip(f"{_library} is not installed", allow_module_level=True)

_REPORT = """
import json, warnings
found = [str(w.message) for w in caught if w.category.__name__ == "IntegrationWarning"]
import accelreg.integrations as _i
states = {s["name"]: {"enabled": s["enabled"], "skipped": s.get("skipped")} for s in _i.status()}
print("@@" + json.dumps({"warnings": found, "states": states}))
"""


def _run(code: str, env: dict[str, str] | None = None) -> dict:
    result = run_python(textwrap.dedent(code) + _REPORT, name=None, env=env)
    line = next(x for x in result.stdout.splitlines() if x.startswith("@@"))
    return json.loads(line[2:])


def _unmatched(integration: str, seam: str) -> str:
    """Code that makes ``seam`` of ``integration`` match no adapter, as a new release would."""
    return textwrap.dedent(
        f"""
        from dataclasses import replace
        import importlib
        _integ = importlib.import_module("accelreg.integrations.{integration}").INTEGRATION
        _integ.seams = [
            replace(s, adapters=tuple(replace(a, shapes=("0" * 16,), params=("no_such_parameter",))
                                      for a in s.candidates(_integ.window)))
            if s.name == {seam!r} else s
            for s in _integ.seams
        ]
        """
    )


def test_users_imports_succeed_when_seams_do_not_match_or_enabling_raises(tmp_path: Path) -> None:
    """One process, three libraries: a patched fake peft release, accelerate with an unmatched
    seam, and a transformers integration whose enabling raises inside transformers' lazy
    import; warnings are errors, as in a strict test suite."""
    import peft

    fake = tmp_path / "site"
    shutil.copytree(Path(peft.__file__).parent, fake / "peft", ignore=shutil.ignore_patterns("__pycache__"))
    other = fake / "peft" / "utils" / "other.py"
    source = other.read_text()
    assert "def infer_device() -> str:" in source
    other.write_text(source.replace("def infer_device() -> str:", "def infer_device() -> str:\n    pass", 1))
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(fake), os.environ.get("PYTHONPATH")]))}
    code = _unmatched("accelerate", "dispatch_model") + textwrap.dedent(
        f"""
        import warnings
        import accelreg
        import accelreg.integrations.transformers as t
        def broken():
            raise RuntimeError("enable() failed for a reason nobody foresaw")
        t.INTEGRATION.on_enable = broken
        accelreg.install()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("error")            # a strict test suite's filter ...
            warnings.showwarning = lambda *a, **k: None
            import peft                               # the user's own lines
            from peft import LoraConfig
            import accelerate
            from accelerate import dispatch_model
            from transformers import GPT2LMHeadModel  # was: ModuleNotFoundError: Could not import ...
        assert peft.__file__.startswith({str(fake)!r}), peft.__file__
        assert GPT2LMHeadModel.__name__ == "GPT2LMHeadModel"
        # warnings were errors inside the hooks, so they were logged, not raised: ask again
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import accelreg.integrations.peft as p, accelreg.integrations.accelerate as a
            p.INTEGRATION.disable(); a.INTEGRATION.disable()
            p.enable(); a.enable()
        """
    )
    out = _run(code, env)
    peft_warning, accelerate_warning = out["warnings"]
    assert "peft.utils.other.infer_device skipped" in peft_warning and "has shape" in peft_warning
    assert "lost: stage adapter weights on the registry's backend" in peft_warning
    assert "accelreg.device_map_for" in peft_warning
    assert "dispatch_model skipped" in accelerate_warning
    assert "lacks parameters ['no_such_parameter']" in accelerate_warning
    assert out["states"]["peft"] == {"enabled": True, "skipped": ["peft.utils.other.infer_device"]}
    assert out["states"]["accelerate"] == {
        "enabled": True,
        "skipped": ["accelerate.big_modeling.dispatch_model"],
    }
    assert out["states"]["transformers"]["enabled"] is False


def test_strict_mode_raises_at_install_or_at_the_next_accelreg_call() -> None:
    """Strict: ``install()`` raises at the call (it enables now); a failure inside a hook while
    strict is recorded and raised by the next accelreg integration call, with its cause."""
    result = run_python(
        _unmatched("accelerate", "dispatch_model")
        + textwrap.dedent(
            """
            import sys
            import accelreg
            import accelreg.integrations.peft as a
            accelreg.configure(strict=True)
            try:
                accelreg.install()
            except accelreg.IntegrationError as exc:
                print("RAISED1", exc)
            assert not any(m in sys.modules for m in ("transformers", "peft")), "strict stops at the first"
            accelreg.integrations.uninstall()
            accelreg.configure(strict=False)
            def broken():
                raise RuntimeError("boom")
            a.INTEGRATION.on_enable = broken
            a.INTEGRATION.seams = []
            accelreg.install()                      # deferred to the import
            accelreg.configure(strict=True)
            import peft                             # the user's import still succeeds
            try:
                accelreg.device_map_for("gpt2")
            except accelreg.IntegrationError as exc:
                print("RAISED2", exc, "| cause:", repr(exc.__cause__))
            """
        ),
        name=None,
    )
    assert "RAISED1 accelerate: 1 seam(s) of accelerate" in result.stdout, result.stdout
    assert "strict mode: nothing was patched" in result.stdout
    assert "RAISED2 strict mode: the peft integration failed when its library was imported" in result.stdout
    assert "cause: RuntimeError('boom')" in result.stdout
