"""Settings sources and their precedence.

For every key the first source that sets it wins, and its whole value is used:

1. explicit arguments (:func:`accelreg.configure`)
2. environment variables (``ACCELREG_PRIORITY=npu,cuda``, ...)
3. the nearest ``accelreg.toml``, else ``pyproject.toml`` ``[tool.accelreg]``, walking up
   from the working directory (in one directory ``accelreg.toml`` beats ``pyproject.toml``)
4. ``$ACCELREG_CONFIG``, else ``$XDG_CONFIG_HOME/accelreg/config.toml``
5. defaults (plugin priorities; ``cpu`` always last)

Configuration files are data: they are parsed as TOML and nothing in them is imported or
executed.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

from . import flags
from ._text import short
from .errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

__all__ = ["KEYS", "Settings", "check_explicit", "did_you_mean", "load_settings", "parse_bool", "parse_names"]

#: Largest configuration file accelreg reads. Anything bigger is refused, not parsed.
MAX_FILE_BYTES = 1 << 20

NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,63}")
_DIST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class _Key(NamedTuple):
    env: str
    kind: str  # "names" | "bool" | "providers" | "timeout"
    default: Any
    doc: str


#: Every configuration key, its environment variable, kind, default and meaning.
KEYS: dict[str, _Key] = {
    "priority": _Key("ACCELREG_PRIORITY", "names", (), "backend order; unlisted backends follow by priority"),
    "disable": _Key("ACCELREG_DISABLE", "names", (), "backends never to use"),
    "plugins": _Key("ACCELREG_PLUGINS", "names", None, "allowlist of external plugins to load (None: all)"),
    "disable_plugin_autoload": _Key(
        "ACCELREG_DISABLE_PLUGIN_AUTOLOAD", "bool", False, "load no external plugin at all"
    ),
    "strict": _Key("ACCELREG_STRICT", "bool", False, "turn plugin failures and warnings into errors"),
    "providers": _Key(
        "ACCELREG_PROVIDERS", "providers", {}, "which distribution provides a contested backend"
    ),
    "probe_timeout": _Key(
        "ACCELREG_PROBE_TIMEOUT", "timeout", 60.0, "seconds a probe may take before it is cut off"
    ),
    "cpu_fallback": _Key(
        "ACCELREG_CPU_FALLBACK",
        "bool",
        False,
        "under a launcher, let resolve() fall back to cpu (with a warning) when an accelerator "
        "is present but failing",
    ),
}


class Settings(NamedTuple):
    """Effective configuration: a value per key plus the source it came from.

    Attributes:
        priority: Backend names tried first, in order.
        disable: Backend (or plugin) names never used.
        plugins: Allowlist of external plugin names, or ``None`` for all.
        disable_plugin_autoload: Whether external entry points are skipped entirely.
        strict: Whether failures and warnings raise.
        providers: Backend name -> distribution chosen where several provide it.
        probe_timeout: Seconds a probe may run.
        cpu_fallback: Whether, under a launcher, ``resolve()`` may fall back to ``cpu`` when an
            accelerator is present but failing (it always warns; without this it raises).
        sources: Key -> where its value came from (``"argument"``, ``"env ACCELREG_PRIORITY"``,
            a file path, or ``"default"``).
        files: The configuration files that were read.
        warnings: Problems that are not errors (unknown keys, one line per file; a working
            directory that no longer exists).
        errors: Configuration files that could not be used (unreadable, malformed, too big,
            bad values), each with its problem. Outside strict mode such a file is skipped
            and reported; in strict mode :func:`load_settings` raises instead.
        shadowed: Key -> ``((source, value), ...)``: what lower-precedence sources also set
            for that key, in precedence order (the effective value is not among them). An
            environment value that does not parse is kept as its text.
    """

    priority: tuple[str, ...] = ()
    disable: tuple[str, ...] = ()
    plugins: tuple[str, ...] | None = None
    disable_plugin_autoload: bool = False
    strict: bool = False
    providers: Mapping[str, str] = MappingProxyType({})
    probe_timeout: float = 60.0
    cpu_fallback: bool = False
    sources: Mapping[str, str] = MappingProxyType({})
    files: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    shadowed: Mapping[str, tuple[tuple[str, Any], ...]] = MappingProxyType({})


def parse_bool(text: str, where: str) -> bool:
    """Parse an environment-style boolean (``1/true/yes/on``, ``0/false/no/off``, as
    :func:`accelreg.flags.parse` reads them); anything else is a :class:`ConfigError`."""
    value = flags.parse(text)
    if value is not None:
        return value
    raise ConfigError(f"{where}: expected a boolean (1/0, true/false, yes/no, on/off), got {text!r}")


def parse_names(text: str, where: str) -> tuple[str, ...]:
    """Parse a comma-separated list of backend or plugin names (``"npu, cuda"``)."""
    items = [item.strip() for item in text.split(",")]
    if items == [""]:
        return ()
    return _check_names(items, where)


def _check_names(items: Any, where: str) -> tuple[str, ...]:
    if isinstance(items, (str, bytes)) or not isinstance(items, (list, tuple)):
        raise ConfigError(f"{where}: expected a list of names, got {type(items).__name__}")
    out: list[str] = []
    seen: set[str] = set()  # a list of thousands of names is checked in linear time
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"{where}: names must be strings, got {short(item)}")
        if not NAME_RE.fullmatch(item):
            raise ConfigError(
                f"{where}: {short(item)} is not a valid name (lower case letters, digits and "
                "underscores, starting with a letter)"
            )
        item = str.__str__(item)
        if item in seen:
            raise ConfigError(f"{where}: {item!r} is listed twice")
        seen.add(item)
        out.append(item)
    return tuple(out)


def _check_providers(value: Any, where: str) -> dict[str, str]:
    if isinstance(value, str):
        pairs: dict[str, str] = {}
        for item in (p.strip() for p in value.split(",")):
            if not item:
                continue
            name, sep, dist = item.partition("=")
            if not sep:
                raise ConfigError(f"{where}: expected name=distribution, got {item!r}")
            if name.strip() in pairs:
                raise ConfigError(f"{where}: {name.strip()!r} is listed twice")
            pairs[name.strip()] = dist.strip()
        value = pairs
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected a table of backend = distribution")
    out: dict[str, str] = {}
    for name, dist in value.items():
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise ConfigError(f"{where}: {short(name)} is not a valid backend name")
        if not isinstance(dist, str) or not _DIST_RE.fullmatch(dist):
            raise ConfigError(f"{where}: {short(dist)} is not a valid distribution name")
        out[name] = dist
    return out


def _check_timeout(value: Any, where: str) -> float:
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ConfigError(f"{where}: expected a number of seconds, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: expected a number of seconds, got {short(value)}")
    try:
        seconds = float(value)
    except OverflowError:  # an int too large for a float: certainly not in range
        seconds = math.inf
    if not math.isfinite(seconds) or not 0 < seconds <= 3600:
        raise ConfigError(f"{where}: probe_timeout must be in (0, 3600] seconds, got {short(value)}")
    return seconds


def _coerce(key: str, value: Any, where: str) -> Any:
    """Validate one value from a file or an argument (already typed, unlike env text)."""
    kind = KEYS[key].kind
    if kind == "names":
        if key == "plugins" and value is None:
            return None
        names = _check_names(value, where)
        _check_cpu(key, names, where)
        return names
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {short(value)}")
        return value
    if kind == "providers":
        return _check_providers(value, where)
    return _check_timeout(value, where)


def _from_env(key: str, text: str, where: str) -> Any:
    kind = KEYS[key].kind
    if kind == "names":
        names = parse_names(text, where)
        _check_cpu(key, names, where)
        return names
    if kind == "bool":
        return parse_bool(text, where)
    if kind == "providers":
        return _check_providers(text, where)
    return _check_timeout(text, where)


def _check_cpu(key: str, names: tuple[str, ...], where: str) -> None:
    if key == "priority" and "cpu" in names[:-1]:
        raise ConfigError(
            f"{where}: cpu is always tried last; to run on the CPU, disable the accelerators "
            "or ask for resolve('cpu')"
        )
    if key == "disable" and "cpu" in names:
        raise ConfigError(f"{where}: the cpu backend cannot be disabled")


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_FILE_BYTES} bytes; refusing to parse it")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text: {exc}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: malformed TOML: {exc}") from None
    except (RecursionError, ValueError, OverflowError, MemoryError) as exc:
        # Arrays nested thousands deep, integers past Python's 4,300-digit limit: valid-looking
        # TOML that the parser cannot take. The file is skipped like a malformed one.
        raise ConfigError(f"{path}: cannot be parsed: {type(exc).__name__}: {str(exc)[:200]}") from None


def _table(path: Path, *, pyproject: bool) -> dict[str, Any] | None:
    data = _read_toml(path)
    if not pyproject:
        return data
    tool = data.get("tool")
    if not isinstance(tool, dict) or "accelreg" not in tool:
        return None
    table = tool["accelreg"]
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.accelreg] must be a table")
    return table


def find_project_file(start: Path) -> tuple[Path, dict[str, Any]] | None:
    """The nearest ``accelreg.toml`` or ``pyproject.toml`` with ``[tool.accelreg]``; a
    :class:`ConfigError` when the nearest thing of either name is not a file (a directory)."""
    for folder in (start, *start.parents):
        for name, is_pyproject in (("accelreg.toml", False), ("pyproject.toml", True)):
            candidate = folder / name
            if not _is_file(candidate, _PROJECT_FILE[is_pyproject]):
                continue
            table = _table(candidate, pyproject=is_pyproject)
            if table is not None:
                return candidate, table
    return None


_PROJECT_FILE = {
    False: "the project configuration file accelreg looks for is a TOML file of that name "
    "(priority = [...], ...), so no project configuration is read until it is renamed or removed",
    True: "the project file accelreg looks for is a TOML file of that name (its [tool.accelreg] "
    "table), so no project configuration is read until it is renamed or removed",
}
_USER_FILE = (
    "the user configuration file accelreg looks for is a TOML file of that name "
    "(priority = [...], ...); rename or remove the directory"
)
#: What a path that is neither a file nor a directory is, by its mode.
_KINDS = (
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _is_file(path: Path, expected: str) -> bool:
    """Whether ``path`` is a regular file (following links), ``False`` where nothing is, and a
    :class:`ConfigError` (ending with ``expected``) where something else is: a directory where a
    configuration file is looked for is a mistake to report, not a file to skip in silence."""
    try:
        mode = path.stat().st_mode
    except (OSError, ValueError):  # not there, a dangling link, a name too long, no permission
        return False
    if stat.S_ISREG(mode):
        return True
    raise ConfigError(f"{path}: {_kind(mode)}, not a file; {expected}")


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "is a directory"
    return "is " + next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


def user_file(environ: Mapping[str, str]) -> Path | None:
    """``$ACCELREG_CONFIG`` (must be a file), else ``$XDG_CONFIG_HOME/accelreg/config.toml``; a
    :class:`ConfigError` when the path is a directory (or anything but a file)."""
    explicit = environ.get("ACCELREG_CONFIG")
    if explicit:
        try:
            path = Path(explicit).expanduser()
            mode = path.stat().st_mode
        except FileNotFoundError:
            raise ConfigError(f"ACCELREG_CONFIG={explicit}: no such file") from None
        except (OSError, RuntimeError, ValueError) as exc:  # a name too long, ~nosuchuser
            raise ConfigError(f"ACCELREG_CONFIG={explicit}: cannot be used: {exc}") from None
        if stat.S_ISREG(mode):
            return path
        hint = ""
        if stat.S_ISDIR(mode):
            inside = next((path / n for n in ("config.toml", "accelreg.toml") if (path / n).is_file()), None)
            hint = f" (did you mean ACCELREG_CONFIG={inside}?)" if inside is not None else ""
        raise ConfigError(
            f"ACCELREG_CONFIG={explicit}: {_kind(mode)}, not a file; ACCELREG_CONFIG names the "
            f"configuration file itself, a TOML file of settings (priority = [...], ...){hint}"
        )
    base = environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    path = Path(base) / "accelreg" / "config.toml"
    return path if _is_file(path, _USER_FILE) else None


def load_settings(
    explicit: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Settings:
    """Merge every source into one :class:`Settings`, or raise :class:`ConfigError`."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = check_explicit(explicit or {})
    sources: dict[str, str] = dict.fromkeys(values, "argument")
    warnings: list[str] = []
    shadowed: dict[str, list[tuple[str, Any]]] = {}

    for key, spec in KEYS.items():
        text = environ.get(spec.env)
        # An empty list variable means "unset", as in shells that export VAR= to clear it.
        if text is None or (text.strip() == "" and spec.kind in ("names", "providers")):
            continue
        if key in values:  # an argument wins; the variable is shown as shadowed
            try:
                shadowed.setdefault(key, []).append((f"env {spec.env}", _from_env(key, text, spec.env)))
            except ConfigError:
                shadowed.setdefault(key, []).append((f"env {spec.env}", text))
            continue
        values[key] = _from_env(key, text, spec.env)
        sources[key] = f"env {spec.env}"

    files: list[str] = []
    errors: list[str] = []
    layers: list[tuple[Path, dict[str, Any]]] = []
    start = cwd if cwd is not None else _working_directory(warnings)
    for finder in (
        lambda: find_project_file(start) if start is not None else None,
        lambda: _user_layer(environ),
    ):
        try:
            found = finder()
        except ConfigError as exc:
            errors.append(str(exc))
            continue
        if found is not None:
            layers.append(found)
    for path, table in layers:
        try:
            file_values = _file_values(path, table, warnings)
        except ConfigError as exc:
            errors.append(str(exc))
            continue
        files.append(str(path))
        for key, value in file_values.items():
            if key not in values:
                values[key] = value
                sources[key] = str(path)
            else:
                shadowed.setdefault(key, []).append((str(path), value))

    for key, spec in KEYS.items():
        if key not in values:
            values[key] = spec.default
            sources[key] = "default"
    if errors and values["strict"]:
        raise ConfigError(errors[0])
    return Settings(
        **values,
        sources=sources,
        files=tuple(files),
        warnings=tuple(warnings),
        errors=tuple(errors),
        shadowed=MappingProxyType({k: tuple(v) for k, v in shadowed.items()}),
    )


def check_explicit(explicit: Mapping[str, Any]) -> dict[str, Any]:
    """Validate settings given as arguments (:func:`accelreg.configure`)."""
    values: dict[str, Any] = {}
    for key, value in explicit.items():
        if key not in KEYS:
            raise ConfigError(
                f"configure(): unknown setting {short(key)}{did_you_mean(key)}; known: {', '.join(KEYS)}"
            )
        values[key] = _coerce(key, value, f"configure({key}=...)")
    return values


def _user_layer(environ: Mapping[str, str]) -> tuple[Path, dict[str, Any]] | None:
    path = user_file(environ)
    return None if path is None else (path, _table(path, pyproject=False))


def _working_directory(warnings: list[str]) -> Path | None:
    """The working directory, or ``None`` (and a warning) when it no longer exists."""
    try:
        return Path.cwd()
    except OSError as exc:
        warnings.append(
            f"the working directory cannot be read ({exc.strerror or exc}); no project configuration "
            "file (accelreg.toml, pyproject.toml) was searched"
        )
        return None


def _file_values(path: Path, table: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    """Validate a whole file first, so a file with one bad value contributes nothing."""
    out: dict[str, Any] = {}
    unknown = [key for key in table if key not in KEYS]
    for key, value in table.items():
        if key in KEYS:
            try:
                out[key] = _coerce(key, value, f"{path}: {key}")
            except ConfigError:
                raise
            except Exception as exc:  # noqa: BLE001 - whatever a value does, the file is skipped
                raise ConfigError(f"{path}: {key}: unusable value: {type(exc).__name__}") from None
    if unknown:
        names = ", ".join(f"{k!r}{did_you_mean(k)}" for k in unknown[:10])
        names += ", ..." if len(unknown) > 10 else ""
        plural = "s" if len(unknown) > 1 else ""
        warnings.append(f"{path}: unknown setting{plural} {names} (known: {', '.join(KEYS)})")
    return out


def did_you_mean(key: Any, form: str = " (did you mean {}?)") -> str:
    """``" (did you mean 'priority'?)"`` for a near miss of a setting name (``priorty``), else ``""``."""
    if not isinstance(key, str):
        return ""
    close = difflib.get_close_matches(key.strip().lower().replace("-", "_"), list(KEYS), n=1, cutoff=0.6)
    return form.format(repr(close[0])) if close else ""
