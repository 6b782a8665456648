"""Configuration precedence: argument > env > project file > user file > defaults."""

from __future__ import annotations

import difflib
import itertools
import warnings

import pytest
import torch

import accelreg
from accelreg import ConfigError
from accelreg.config import load_settings

from ._fakes import plugin, spec

SOURCES = ("argument", "env", "project", "user")


def _three_backends():
    accelreg.register(
        plugin(
            spec("cuda", 1, priority=100),
            spec("xpu", 1, priority=90),
            spec("hpu", 1, priority=40, indexed=False, device=lambda i: torch.device("hpu")),
        ),
        "fakeplugin_three",
    )


def _apply(source, value, monkeypatch, tmp_path):
    names = ", ".join(f'"{n}"' for n in value)
    if source == "argument":
        accelreg.configure(priority=list(value))
    elif source == "env":
        monkeypatch.setenv("ACCELREG_PRIORITY", ",".join(value))
    elif source == "project":
        (tmp_path / "work" / "pyproject.toml").write_text(
            f"[project]\nname='x'\n[tool.accelreg]\npriority = [{names}]\n"
        )
    elif source == "user":
        (tmp_path / "xdg" / "accelreg").mkdir(parents=True, exist_ok=True)
        (tmp_path / "xdg" / "accelreg" / "config.toml").write_text(f"priority = [{names}]\n")


CHOICES = {"argument": ("hpu",), "env": ("xpu",), "project": ("cuda", "hpu"), "user": ("xpu", "hpu")}
EXPECTED = {"argument": "hpu", "env": "xpu", "project": "cuda", "user": "xpu"}


@pytest.mark.parametrize(
    "present",
    [c for r in range(1, 5) for c in itertools.combinations(SOURCES, r)],
    ids=lambda c: "+".join(c),
)
def test_precedence_matrix(present, monkeypatch, tmp_path):
    _three_backends()
    for source in present:
        _apply(source, CHOICES[source], monkeypatch, tmp_path)
    accelreg.reset() if "argument" not in present else None
    if "argument" not in present:
        _three_backends()
    winner = present[0]  # SOURCES is in precedence order
    assert accelreg.current_backend().name == EXPECTED[winner]
    settings = load_settings({"priority": CHOICES["argument"]} if winner == "argument" else {})
    assert list(settings.priority) == list(CHOICES[winner])
    # the whole list of the winner is used, never merged with another source's list
    order = [b.name for b in accelreg.backends()]
    assert order[: len(CHOICES[winner])] == list(CHOICES[winner])
    assert order[-1] == "cpu"


def test_defaults_when_nothing_is_set():
    _three_backends()
    assert accelreg.current_backend().name == "cuda"
    s = load_settings()
    assert s.sources["priority"] == "default" and s.priority == ()


def test_accelreg_toml_beats_pyproject_in_the_same_folder(tmp_path):
    work = tmp_path / "work"
    (work / "pyproject.toml").write_text("[tool.accelreg]\npriority = ['cuda']\n")
    (work / "accelreg.toml").write_text("priority = ['xpu']\n")
    assert load_settings().priority == ("xpu",)
    assert load_settings().sources["priority"] == str(work / "accelreg.toml")


def test_nearest_folder_wins_and_pyproject_without_table_is_skipped(tmp_path):
    work = tmp_path / "work"
    deep = work / "a" / "b"
    deep.mkdir(parents=True)
    (work / "accelreg.toml").write_text("priority = ['xpu']\n")
    (work / "a" / "pyproject.toml").write_text("[project]\nname = 'x'\n")  # no [tool.accelreg]
    (deep / "pyproject.toml").write_text("[tool.accelreg]\npriority = ['hpu']\n")
    assert load_settings(cwd=deep).priority == ("hpu",)
    assert load_settings(cwd=work / "a").priority == ("xpu",)


def test_accelreg_config_variable_beats_xdg(monkeypatch, tmp_path):
    (tmp_path / "xdg" / "accelreg").mkdir(parents=True)
    (tmp_path / "xdg" / "accelreg" / "config.toml").write_text("priority = ['xpu']\n")
    other = tmp_path / "other.toml"
    other.write_text("priority = ['hpu']\n")
    monkeypatch.setenv("ACCELREG_CONFIG", str(other))
    assert load_settings().priority == ("hpu",)


BROKEN = {
    "malformed": "priority = [\n",
    "not utf-8": b"\xff\xfe priority",
    "wrong type": "priority = 'npu'\n",
    "bad name": "priority = ['NPU!']\n",
    "duplicate": "priority = ['npu', 'npu']\n",
    "cpu first": "priority = ['cpu', 'npu']\n",
    "bad bool": "strict = 'yes'\n",
    "bad timeout": "probe_timeout = -1\n",
    "huge": "# " + "x" * (1 << 21) + "\n",
    "nested 5,000 deep": "x = " + "[" * 5000 + "]" * 5000 + "\n",
    "5,000-digit integer": "probe_timeout = " + "7" * 5000 + "\n",
    "timeout 1 and 400 zeros": "probe_timeout = 1" + "0" * 400 + "\n",
    "priority names a huge int": "priority = [" + "7" * 400 + "]\n",
}


@pytest.mark.parametrize("where", ["project", "user"])
@pytest.mark.parametrize("problem", sorted(BROKEN))
def test_broken_file_is_reported_and_skipped_or_fatal_when_strict(problem, where, tmp_path, monkeypatch):
    content = BROKEN[problem]
    path = (
        tmp_path / "work" / "accelreg.toml"
        if where == "project"
        else tmp_path / "xdg" / "accelreg" / "config.toml"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    settings = load_settings()
    assert len(settings.errors) == 1 and str(path) in settings.errors[0]
    assert settings.priority == ()  # nothing from the broken file is used
    with pytest.warns(RuntimeWarning, match="configuration file skipped"):
        assert accelreg.resolve() == torch.device("cpu")
    monkeypatch.setenv("ACCELREG_STRICT", "1")
    with pytest.raises(ConfigError, match=str(path).replace("\\", "\\\\")):
        load_settings()


@pytest.mark.parametrize("where", ["accelreg.toml", "pyproject.toml", "parent accelreg.toml", "user"])
def test_a_directory_where_a_configuration_file_is_looked_for_is_an_error(where, tmp_path, monkeypatch):
    """Not skipped in silence (the user meant it as configuration) and not a traceback: one error
    naming the path and the file expected there; the layer is skipped, or fatal when strict."""
    path = {
        "accelreg.toml": tmp_path / "work" / "accelreg.toml",
        "pyproject.toml": tmp_path / "work" / "pyproject.toml",
        "parent accelreg.toml": tmp_path / "accelreg.toml",  # met while walking up from work/
        "user": tmp_path / "xdg" / "accelreg" / "config.toml",
    }[where]
    path.mkdir(parents=True)
    (path / "config.toml").write_text("priority = ['xpu']\n")  # not read: the name is the folder's
    if where != "user":  # a project file further up is not reached past the mistake
        (tmp_path / "pyproject.toml").write_text("[tool.accelreg]\npriority = ['hpu']\n")
    settings = load_settings()
    assert settings.priority == () and settings.files == ()
    assert len(settings.errors) == 1, settings.errors
    error = settings.errors[0]
    assert error.startswith(f"{path}: is a directory, not a file; ") and "TOML file" in error, error
    assert ("user configuration file" if where == "user" else "no project configuration is read") in error
    monkeypatch.setenv("ACCELREG_STRICT", "1")
    with pytest.raises(ConfigError, match="is a directory, not a file"):
        load_settings()


def test_accelreg_config_naming_a_directory_says_so(tmp_path, monkeypatch):
    folder = tmp_path / "cfg"
    folder.mkdir()
    monkeypatch.setenv("ACCELREG_CONFIG", str(folder))
    (error,) = load_settings().errors
    assert error == (
        f"ACCELREG_CONFIG={folder}: is a directory, not a file; ACCELREG_CONFIG names the "
        "configuration file itself, a TOML file of settings (priority = [...], ...)"
    )
    (folder / "config.toml").write_text("priority = ['xpu']\n")
    (error,) = load_settings().errors
    assert error.endswith(f" (did you mean ACCELREG_CONFIG={folder / 'config.toml'}?)")
    monkeypatch.setenv("ACCELREG_CONFIG", str(tmp_path / "missing.toml"))
    assert load_settings().errors == (f"ACCELREG_CONFIG={tmp_path / 'missing.toml'}: no such file",)


def test_unreadable_file(tmp_path, monkeypatch):
    target = tmp_path / "cfg.toml"
    target.write_text("priority = ['npu']\n")
    target.chmod(0)
    monkeypatch.setenv("ACCELREG_CONFIG", str(target))
    import os

    if os.geteuid() == 0:  # root reads anything; use a missing file for the unreadable case
        monkeypatch.setenv("ACCELREG_CONFIG", str(tmp_path / "missing.toml"))
    settings = load_settings()
    assert settings.errors and (
        "cannot be read" in settings.errors[0] or "no such file" in settings.errors[0]
    )


@pytest.mark.parametrize(
    ("var", "value", "match"),
    [
        ("ACCELREG_PRIORITY", "npu,,cuda", "not a valid name"),
        ("ACCELREG_PRIORITY", "npu,npu", "listed twice"),
        ("ACCELREG_PRIORITY", "cpu,npu", "always tried last"),
        ("ACCELREG_DISABLE", "cpu", "cannot be disabled"),
        ("ACCELREG_STRICT", "maybe", "expected a boolean"),
        ("ACCELREG_PROBE_TIMEOUT", "soon", "number of seconds"),
        ("ACCELREG_PROBE_TIMEOUT", "0", r"\(0, 3600\]"),
        ("ACCELREG_PROVIDERS", "npu", "name=distribution"),
        ("ACCELREG_PROVIDERS", "npu=acme,npu=other", "'npu' is listed twice"),
        ("ACCELREG_CPU_FALLBACK", "maybe", "expected a boolean"),
        ("ACCELREG_PROBE_TIMEOUT", "1" + "0" * 400, r"\(0, 3600\]"),
    ],
)
def test_bad_environment_values_are_errors(var, value, match, monkeypatch):
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError, match=match):
        load_settings()
    with pytest.raises(ConfigError, match=match):
        accelreg.resolve()


def test_empty_list_variable_means_unset(monkeypatch):
    monkeypatch.setenv("ACCELREG_PRIORITY", "")
    assert load_settings().sources["priority"] == "default"


def test_configure_validates_before_changing_anything():
    accelreg.configure(priority=["xpu"])
    with pytest.raises(ConfigError, match="unknown setting"):
        accelreg.configure(prority=["cuda"])
    with pytest.raises(ConfigError):
        accelreg.configure(priority="cuda")
    from accelreg import registry

    assert registry.get().settings.priority == ("xpu",)


def test_unknown_priority_name_warns_or_fails_strict():
    with pytest.warns(RuntimeWarning, match="names 'acme', which no installed plugin provides"):
        accelreg.configure(priority=["acme"])
        accelreg.resolve()
    accelreg.configure(strict=True)
    with pytest.raises(ConfigError, match="'acme'"):
        accelreg.resolve()


def _unknown_warnings(source, names, monkeypatch, tmp_path):
    """The accelreg warnings the first ``resolve()`` gives with ``names`` as ``priority``."""
    _apply(source, names, monkeypatch, tmp_path)
    accelreg.reset() if source != "argument" else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert accelreg.resolve() == torch.device("cpu")
    return [str(w.message) for w in caught if "no installed plugin provides" in str(w.message)]


@pytest.mark.parametrize("source", ["argument", "env", "project"])
def test_a_long_priority_list_of_unknown_names_is_one_warning(source, monkeypatch, tmp_path):
    """2,000 names no plugin provides: one warning with the count, the first few (each with its
    "did you mean") and the known backends, not 2,000 warnings; strict mode raises it."""
    names = ["nup", *(f"nope{i}" for i in range(1999))]
    (message,) = _unknown_warnings(source, names, monkeypatch, tmp_path)
    assert "names 2,000 backends that no installed plugin provides: 'nup' (did you mean 'npu'?), " in message
    assert "'nope0', 'nope1', 'nope2', 'nope3' and 1,995 more; known backends: cpu, cuda, " in message
    assert "nope4" not in message and len(message) < 400, message
    accelreg.configure(strict=True)
    with pytest.raises(ConfigError, match=r"names 2,000 backends .* and 1,995 more; known backends"):
        accelreg.resolve()


def test_a_few_unknown_names_are_listed_in_one_warning(monkeypatch, tmp_path):
    (message,) = _unknown_warnings("env", ["acme", "zeta"], monkeypatch, tmp_path)
    assert message.startswith(
        "accelreg: priority (env ACCELREG_PRIORITY) names 2 backends that no installed plugin "
        "provides: 'acme', 'zeta'; known backends: "
    )


def test_the_suggestion_work_does_not_grow_with_the_priority_list(monkeypatch, tmp_path):
    """A "did you mean" is worked out for the names the warning shows only: as many difflib
    calls for 2,000 unknown names as for 6 (counted, not timed)."""
    calls = []
    real = difflib.get_close_matches
    monkeypatch.setattr(difflib, "get_close_matches", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    counts = []
    for n in (6, 2000):
        calls.clear()
        names = [f"nope{i}" for i in range(n)]
        assert len(_unknown_warnings("argument", names, monkeypatch, tmp_path)) == 1
        counts.append(len(calls))
    assert counts[0] == counts[1] and 0 < counts[1] <= 5, (counts, calls)


def test_unknown_key_in_file_is_a_warning(tmp_path):
    (tmp_path / "work" / "accelreg.toml").write_text("priorty = ['npu']\n")
    assert "unknown setting 'priorty'" in load_settings().warnings[0]


def test_unknown_keys_warn_once_per_file(tmp_path):
    path = tmp_path / "work" / "accelreg.toml"
    path.write_text("probe_timout = 5\nstrikt = true\n")
    with pytest.warns(RuntimeWarning) as record:
        accelreg.resolve("cpu")
    (message,) = [str(w.message) for w in record]
    assert (
        f"{path}: unknown settings 'probe_timout' (did you mean 'probe_timeout'?), "
        "'strikt' (did you mean 'strict'?)" in message
    )
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        accelreg.configure(priority=["xpu"])  # a new snapshot reads the file again: no repeat
        accelreg.resolve("cpu")


def test_configure_refuses_numbers_too_large_for_a_float():
    for value in (10**400, -(10**400)):
        with pytest.raises(
            ConfigError, match=r"probe_timeout must be in \(0, 3600\] seconds, got an integer"
        ):
            accelreg.configure(probe_timeout=value)
    with pytest.raises(ConfigError, match="names must be strings"):
        accelreg.configure(priority=[10**5000])


def test_a_deleted_working_directory_skips_the_project_file_search(tmp_path, monkeypatch):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    settings = load_settings()
    assert settings.errors == () and "no project configuration file" in settings.warnings[0]
    with pytest.warns(RuntimeWarning, match="working directory cannot be read"):
        assert accelreg.resolve("cpu") == torch.device("cpu")


def test_config_files_are_data_only(tmp_path):
    marker = tmp_path / "executed"
    (tmp_path / "work" / "accelreg.toml").write_text(
        f'priority = [\'__import__("os").system("touch {marker}")\']\n'
    )
    assert load_settings().errors  # an invalid name, reported; never evaluated
    assert not marker.exists()
