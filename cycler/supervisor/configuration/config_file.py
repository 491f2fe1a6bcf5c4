"""``cycle run --config``: a YAML file of ``option: value`` lines, read with YAML 1.2's numbers
and every value checked against the type its option declares (:mod:`.options`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cycler.errors import ConfigError


def read_config_file(path: Path, types: Mapping[str, tuple[type, ...]]) -> dict[str, Any]:
    """The options set in a YAML file, keys normalised to underscores, each value one of the
    ``types`` its key allows; ConfigError (one line naming the file and key) if invalid."""
    import yaml  # only runs with --config: every start of cycle run would pay for it

    try:
        loaded = yaml.load(Path(path).read_text(), Loader=_yaml12_loader())
    except OSError as error:
        raise ConfigError(f"cannot read config file {path}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not text (binary?); give a YAML file of "
                          "option: value lines") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"config file {path} is not valid YAML: {_one_line(error)}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path} must be a mapping of option: value")
    options = {}
    for key, value in loaded.items():
        name = _config_key(path, key, types)
        options[name] = _checked_value(path, name, value, types[name])
    return options


def _yaml12_loader() -> type:
    """PyYAML's safe loader with YAML 1.2's integers and booleans: ``1:2`` and ``010`` stay
    strings (YAML 1.1 reads them as sexagesimal 62 and octal 8, which no one writing ``nnodes:
    1:2`` or ``resume_from: 010`` means), and so do ``on``/``off``/``yes``/``no`` (YAML 1.1's
    booleans: ``preemption_notices: off`` is the word off); an option that takes a boolean
    reads them as one (:func:`_checked_value`)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    replaced = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:bool")
    Loader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in replaced]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    Loader.add_implicit_resolver("tag:yaml.org,2002:bool",
                                 re.compile(r"^(true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
    Loader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?(0|[1-9][0-9]*)$"),
                                 list("-+0123456789"))
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?([0-9]+\.[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$"
                   r"|^[-+]?[0-9]+[eE][-+]?[0-9]+$"
                   r"|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$"), list("-+0123456789."))
    return Loader


def _config_key(path: Path, key: object, types: Mapping[str, tuple[type, ...]]) -> str:
    name = str(key).replace("-", "_")
    if name not in types:
        raise ConfigError(f"config file {path}: unknown key {key!r}; known keys: "
                          f"{', '.join(sorted(types))}")
    return name


_WORDS = {"on": True, "yes": True, "off": False, "no": False}
"""YAML 1.1's boolean words, read as booleans by the options that take one."""


def _checked_value(path: Path, key: str, value: object, allowed: tuple[type, ...]) -> object:
    wanted = " or ".join(kind.__name__ for kind in allowed)
    if value is None:
        raise ConfigError(f"config file {path}: {key} has no value (~, null or nothing after "
                          f"the colon); give {wanted}, or remove the line to take the default")
    if bool in allowed and isinstance(value, str) and value.lower() in _WORDS:
        return _WORDS[value.lower()]
    # bool is an int in Python, but ``grace: true`` is a mistake, not one second.
    if isinstance(value, bool) and bool not in allowed or not isinstance(value, allowed):
        raise ConfigError(f"config file {path}: {key} must be {wanted}, not "
                          f"{type(value).__name__} ({value!r})")
    if key in ("resume_from", "rdzv_id"):
        return str(value)
    return value


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())
