"""Loading the configuration: YAML read, overridden from the environment, validated at once
against the declarations (`settings.declarations`), the checks on disk made here.

Every problem in a file is collected and reported together, each with its key path, so a bad
config fails at start with one message.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, Final, Literal

import yaml

from agent.guarded import nofollow
from agent.settings.declarations import (
    ENV_OVERRIDES,
    NAME_RE,
    RETIRED,
    AgentConfig,
    CacheConfig,
    Check,
    ConfigError,
    OnDisk,
    StorageConfig,
    cross_checks,
)

_LOGGER = logging.getLogger(__name__)

_SHOWN_CHARS: Final = 60
"""How much of a bad value a problem quotes."""


DEFAULT_CONFIG_PATH: Final = Path(__file__).resolve().parents[2] / "config" / "agent.yaml"
"""The default configuration file of a source checkout (absent from an installed wheel)."""


MAX_CONFIG_BYTES: Final = 1 << 20
"""The largest configuration file read (1 MiB: a full one is a few KB); larger is refused
before it is read."""


SYSTEM_CONFIG_PATH: Final = Path("/etc/voice-agent/agent.yaml")
"""Where an installed agent looks when no file is named (the systemd unit names it)."""


def default_config_path() -> Path | None:
    """The file read when none is named: the checkout's, else the system's; None when neither
    exists (then every key takes its default: no file is needed)."""
    return next((p for p in (DEFAULT_CONFIG_PATH, SYSTEM_CONFIG_PATH) if p.is_file()), None)


def _readable_file(value: Any) -> str | None:
    return None if os.access(value, os.R_OK) and Path(value).is_file() else "no readable file"


def _voice_model(value: Any) -> str | None:
    if not Path(value).is_file():
        return "no such model file"
    if not Path(f"{value}.json").is_file():
        return f"the voice config {value}.json is missing beside the model"
    return None


def load(
    path: Path | None = None,
    environ: Mapping[str, str] | None = None,
    hostname: Callable[[], str] = socket.gethostname,
) -> AgentConfig:
    """Load, override and validate a configuration file; with no path, the default file if
    there is one (`default_config_path`), else the defaults alone."""
    path = path or default_config_path()
    if path is None:
        return from_mapping({}, "(defaults)", os.environ if environ is None else environ, hostname)
    source = str(path)
    try:  # a link is followed (the operator's file); a FIFO or a device never blocks the start
        data = nofollow.read_regular(path, MAX_CONFIG_BYTES)
    except nofollow.FileRefusedError as err:
        raise ConfigError(source, [f"cannot read the file: it is {err.found}"]) from None
    except OSError as err:
        raise ConfigError(source, [f"cannot read the file: {err.strerror or err}"]) from err
    if len(data) > MAX_CONFIG_BYTES:  # it grew while read
        raise ConfigError(source, [f"cannot read the file: over {MAX_CONFIG_BYTES} bytes"])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(source, [f"not UTF-8 (byte {err.start})"]) from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(source, [f"not valid YAML: {err}"]) from err
    except RecursionError:
        raise ConfigError(source, ["not valid YAML: nested too deeply"]) from None
    except ValueError:  # an integer of more digits than Python converts
        raise ConfigError(source, ["not valid YAML: a number of thousands of digits"]) from None
    return from_mapping(
        {} if raw is None else raw, source, os.environ if environ is None else environ, hostname
    )


def from_mapping(
    raw: Any,
    source: str = "<mapping>",
    environ: Mapping[str, str] | None = None,
    hostname: Callable[[], str] = socket.gethostname,
) -> AgentConfig:
    """Validate an already parsed configuration; raises ConfigError listing every problem."""
    problems: list[str] = []
    if not isinstance(raw, dict):
        raise ConfigError(source, [f"(top level): expected a mapping, got {_kind(raw)}"])
    raw = _with_overrides(raw, environ or {})
    if raw.get("node_id") in (None, ""):
        raw["node_id"] = re.sub(r"[^A-Za-z0-9_-]", "-", hostname())[:64] or "voice-agent"
    config = _build(AgentConfig, raw, "", problems)
    if not problems:
        problems.extend(cross_checks(config))
    if problems:
        raise ConfigError(source, problems)
    assert isinstance(config, AgentConfig)  # noqa: S101 - no problems means it was built
    return config


def _with_overrides(raw: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    merged = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    for var, path in ENV_OVERRIDES.items():
        if var not in environ:
            continue
        *parents, leaf = path.split(".")
        node = merged
        for p in parents:
            child = node.get(p)
            if child is None:
                node[p] = child = {}
            if not isinstance(child, dict):
                break  # leave the section as it is: its own error is reported
            node = child
        else:
            node[leaf] = _EnvValue(var, environ[var])
    return merged


@dataclass(frozen=True, slots=True)
class _EnvValue:
    """A value taken from the environment: still a string, named for error messages."""

    var: str
    text: str


def _build(cls: type, raw: Any, prefix: str, problems: list[str]) -> Any:
    if raw is None:
        raw = {}  # a section with every key commented out
    if not isinstance(raw, dict):
        problems.append(
            f"{prefix.rstrip('.') or '(top level)'}: expected a mapping, got {_kind(raw)}"
        )
        return None
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    for key in raw:
        if key in known:
            continue
        if f"{prefix}{key}" in RETIRED:
            _LOGGER.warning("%s%s is no longer used: %s", prefix, key, RETIRED[f"{prefix}{key}"])
            continue
        problems.append(f"{prefix}{key}: unknown key (expected one of: {', '.join(sorted(known))})")
    values: dict[str, Any] = {}
    complete = True
    for f in fields(cls):
        path = f"{prefix}{f.name}"
        hint = hints[f.name]
        if f.default is MISSING and f.default_factory is MISSING and f.name not in raw:
            problems.append(f"{path}: missing (this key has no default)")
            complete = False
        elif is_dataclass(hint):
            values[f.name] = _build(
                typing.cast(type, hint), raw.get(f.name, {}), f"{path}.", problems
            )
        elif f.name in raw:
            raw_value = raw[f.name]
            problems_before = len(problems)
            values[f.name] = _value(raw_value, hint, path, f.metadata["check"], problems)
            if f.metadata.get("secret"):
                problems[problems_before:] = [
                    _without(problem, raw_value) for problem in problems[problems_before:]
                ]
    return cls(**values) if complete else None


def _value(raw: Any, hint: Any, path: str, check: Check | None, problems: list[str]) -> Any:
    where = path
    if isinstance(raw, _EnvValue):
        where = f"{path} (from ${raw.var})"
        raw = _from_env(raw.text, hint)
    if typing.get_origin(hint) in (Mapping, tuple):
        return _container(raw, hint, path, check, problems)
    if typing.get_origin(hint) is Literal:
        return _choice(raw, typing.get_args(hint), where, problems)
    optional = isinstance(hint, types.UnionType) and type(None) in typing.get_args(hint)
    base = (
        next((a for a in typing.get_args(hint) if a is not type(None)), hint) if optional else hint
    )
    if raw is None:
        if not optional:
            problems.append(f"{where}: expected {_expected(base)}, got null")
        return None
    value = _coerce(raw, base)
    if value is None:
        problems.append(f"{where}: expected {_expected(base)}, got {_kind(raw)} {_shown(raw)}")
        return None
    reason = (
        _ON_DISK[check](value) if isinstance(check, OnDisk) else check(value) if check else None
    )
    if reason:
        problems.append(f"{where}: {reason}, got {_shown(raw)}")
    return value


def _without(problem: str, secret: Any) -> str:
    """A problem's text with a secret's value taken out."""
    text = secret.text if isinstance(secret, _EnvValue) else str(secret)
    return (
        problem.replace(repr(text), "(not shown)").replace(text, "(not shown)") if text else problem
    )


def _container(raw: Any, hint: Any, path: str, check: Check | None, problems: list[str]) -> Any:
    """A map with name keys, or a list (held as a tuple); `check` applies to each value."""
    if typing.get_origin(hint) is tuple:
        if not isinstance(raw, list):
            problems.append(f"{path}: expected a list, got {_kind(raw)}")
            return ()
        item = typing.get_args(hint)[0]
        if is_dataclass(item):  # a list of sections: each built as one, its keys' paths indexed
            return tuple(_section(v, item, f"{path}[{i}]", problems) for i, v in enumerate(raw))
        return tuple(_value(v, item, f"{path}[{i}]", check, problems) for i, v in enumerate(raw))
    if not isinstance(raw, dict):
        problems.append(f"{path}: expected a mapping, got {_kind(raw)}")
        return {}
    item = typing.get_args(hint)[1]
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not NAME_RE.fullmatch(key) or key == "default":
            problems.append(
                f"{path}.{key}: expected a name of 1-64 of A-Z a-z 0-9 _ - other than 'default'"
            )
            continue
        out[key] = _value(value, item, f"{path}.{key}", check, problems)
    return out


def _section(raw: Any, cls: Any, path: str, problems: list[str]) -> Any:
    """One item of a list of sections (`mqtt.hosts[1]`): a mapping built like a section."""
    if not isinstance(raw, dict):
        names = ", ".join(f.name for f in fields(cls))
        problems.append(f"{path}: expected a mapping of {names}, got {_kind(raw)} {_shown(raw)}")
        return None
    return _build(cls, raw, f"{path}.", problems)


def _choice(raw: Any, choices: tuple[str, ...], where: str, problems: list[str]) -> str | None:
    """One of a few words; an unquoted YAML number is taken as its text (`protocol: 5`)."""
    text = str(raw) if isinstance(raw, int | float) and not isinstance(raw, bool) else raw
    if isinstance(text, str) and text in choices:
        return text
    problems.append(f"{where}: expected one of {', '.join(choices)}, got {_shown(raw)}")
    return None


def _from_env(text: str, hint: Any) -> Any:
    if hint is int:
        try:
            return int(text)
        except ValueError:
            return text
    return text or None


def _coerce(raw: Any, base: Any) -> Any:
    if base is bool:
        return raw if isinstance(raw, bool) else None
    if base is int:
        return raw if isinstance(raw, int) and not isinstance(raw, bool) else None
    if base is float:
        return _float(raw)
    if base is str:
        return raw if isinstance(raw, str) else None
    if base is Path:
        return Path(raw).expanduser() if isinstance(raw, str) and raw else None
    raise TypeError(f"unsupported config type {base!r}")  # a programming error, not user input


def _float(raw: Any) -> float | None:
    """A number as a float; None for anything else and an integer beyond any float."""
    if not isinstance(raw, int | float) or isinstance(raw, bool):
        return None
    try:
        return float(raw)
    except OverflowError:
        return None


def _shown(raw: Any) -> str:
    """A value as a problem quotes it: its repr, cut short (a value may be huge)."""
    text = repr(raw)
    return text if len(text) <= _SHOWN_CHARS else f"{text[:_SHOWN_CHARS]}... ({len(text)} chars)"


def _expected(base: Any) -> str:
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return names.get(base, "a path")


def _kind(raw: Any) -> str:
    if isinstance(raw, _EnvValue):
        return "string"
    return {dict: "a mapping", list: "a list", type(None): "null"}.get(
        type(raw), type(raw).__name__
    )


def resolve_storage_dir(config: StorageConfig, environ: Mapping[str, str]) -> Path:
    """The journal's directory: the configured one, else systemd's, else the XDG one."""
    if config.dir is not None:
        return config.dir
    if environ.get("STATE_DIRECTORY"):
        return Path(environ["STATE_DIRECTORY"].split(":")[0])
    base = environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "voice-agent"


def resolve_cache_dir(config: CacheConfig, environ: Mapping[str, str]) -> Path:
    """The cache directory: the configured one, else systemd's, else the XDG one."""
    if config.dir is not None:
        return config.dir
    if environ.get("CACHE_DIRECTORY"):
        return Path(environ["CACHE_DIRECTORY"].split(":")[0])
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "voice-agent"


_ON_DISK: Final[Mapping[OnDisk, Callable[[Any], str | None]]] = {
    OnDisk.READABLE_FILE: _readable_file,
    OnDisk.VOICE_MODEL: _voice_model,
}
