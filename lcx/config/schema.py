"""The one check of every config section an entry point reads against its typed class.

The typed frozen dataclasses (:data:`lcx.config.sections.SECTIONS`, the data configs of
:mod:`lcx.data.config`) are the schema: :func:`typed` checks a composed section against one and
builds it. ``plan`` has its own Hydra schema (:mod:`lcx.config.plan`); ``model`` is checked by
:meth:`lcx.models.ModelConfig.from_dict`.

:func:`check_section` refuses, before anything compiles:

- a key not in the class, also one appended with ``+`` (``+train.stpes=1``), naming the nearest
  valid key (difflib) and listing the valid ones;
- a value of the wrong type (``train.steps=1.5``, ``checkpoint.async_save=no``), naming the key,
  the value and the fix; ``key=no``/``off`` arrive from Hydra as strings and are refused, never
  read as true;
- (``complete=True``) a key the class has that the section lacks.

A misspelt key *without* ``+`` is already refused by Hydra (the composed config is a struct);
:func:`check_overrides` runs on the command line first so that message names the nearest key too.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import pathlib
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from lcx.config.sections import DATA_CONFIGS, SECTIONS
from lcx.reports.config import EvalCheckpointConfig

REQUIRED = dataclasses.MISSING


# -- the check ------------------------------------------------------------------------------------


def _plain(node: Any) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf
    from omegaconf.errors import InterpolationResolutionError

    if isinstance(node, (DictConfig, ListConfig)):
        try:
            return OmegaConf.to_container(node, resolve=True)
        except InterpolationResolutionError:
            # ${hydra:...} outside a Hydra run (the compose API): such values stay unchecked
            return OmegaConf.to_container(node, resolve=False)
    return node


def nearest(key: str, valid: Sequence[str]) -> str | None:
    """The valid key most like ``key`` (difflib), or None when none is close."""
    m = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.6)
    return m[0] if m else None


def unknown_key_message(section: str, key: str, valid: Sequence[str], tool: str = "lcx") -> str:
    near = nearest(key, valid)
    hint = f"did you mean {section}.{near}? " if near else ""
    return (
        f"{section}.{key}: unknown key; {hint}{tool} reads {', '.join(f'{section}.{k}' for k in sorted(valid))} "
        f"(a misspelt key is refused, never ignored)"
    )


def _check_value(key: str, value: Any, tp: Any) -> Any:
    """``value`` converted to ``tp`` (an int-valued float to int, an int to float), or ValueError."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _check_value(key, value, args[0])
    if value is None:
        raise ValueError(f"{key}=null: must be set (a {getattr(tp, '__name__', tp)}); write {key}=<value>")
    if isinstance(value, str) and (value == "???" or value.startswith("${")):
        return value  # unset (the reader's own message names the fix), or an unresolved interpolation
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{key}={value!r}: must be true or false (a boolean); write {key}=true or {key}=false")
        return value
    if tp is int:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{key}={value!r}: must be a whole number")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{key}={value!r}: must be a number")
        return float(value)
    if tp is pathlib.Path:
        if not isinstance(value, (str, pathlib.Path)):
            raise ValueError(f"{key}={value!r}: must be a path")
        return value if value == "???" else pathlib.Path(value)
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"{key}={value!r}: must be a string")
        return value
    if origin is list:
        if isinstance(value, str):
            items = ",".join(x for x in re.split(r"[x,\s]+", value) if x) or value  # 4x4x3 -> [4,4,3]
            raise ValueError(f"{key}={value!r}: must be a list, e.g. {key}=[{items}]")
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{key}={value!r}: must be a list")
        (inner,) = typing.get_args(tp) or (Any,)
        return [_check_value(f"{key}[{i}]", v, inner) for i, v in enumerate(value)]
    return value


def check_section(node: Any, schema: type, section: str, *, complete: bool = True, tool: str = "lcx") -> dict:
    """The config section ``node`` checked against ``schema``, as a plain dict of typed values.

    Args:
      node: the section (DictConfig or mapping); None counts as empty.
      schema: its typed dataclass.
      section: its dotted name, for messages (``train``, ``data``).
      complete: every field of ``schema`` without a default must be present.
      tool: the entry point, for messages.

    Raises:
      ValueError: an unknown key (names the nearest valid one), a value of the wrong type, or
        (``complete``) a missing key.
    """
    d = _plain(node) or {}
    if not isinstance(d, Mapping):
        raise ValueError(f"{section}={d!r}: must be a mapping of {schema.__name__} keys")
    hints = typing.get_type_hints(schema)
    fields = {f.name: f for f in dataclasses.fields(schema)}
    out = {}
    for k, v in d.items():
        if k not in fields:
            raise ValueError(unknown_key_message(section, str(k), list(fields), tool))
        out[k] = _check_value(f"{section}.{k}", v, hints[k])
    if complete:
        for k, f in fields.items():
            if k in out:
                continue
            if f.default is REQUIRED and f.default_factory is REQUIRED:
                raise ValueError(
                    f"{section}.{k} is missing: {tool} needs it (add {section}.{k}=<value>, or "
                    f"compose the config from conf/)"
                )
            out[k] = f.default
    return out


C = TypeVar("C")


def typed(
    node: Any,
    cls: type[C],
    section: str,
    *,
    tool: str = "lcx",
    resolve: Mapping[str, Callable[[Any], Any]] | None = None,
) -> C:
    """The section ``node`` as its typed value: :func:`check_section` (complete), then ``cls``
    built from it.

    Args:
      node: the section (DictConfig or mapping); None counts as empty.
      cls: its typed frozen dataclass (the schema).
      section: its dotted name, for messages.
      tool: the entry point, for messages.
      resolve: a function per key applied to its checked value (a path made absolute, say).

    Raises:
      ValueError: as :func:`check_section`; a mandatory value (``???``) left unset, naming the
        key; whatever ``cls`` refuses (its ``__post_init__``).
    """
    d = check_section(node, cls, section, tool=tool)
    for k, v in d.items():
        if v == "???":
            raise ValueError(f"{section}.{k} is required by {tool} and unset: add {section}.{k}=<value>")
    for k, f in (resolve or {}).items():
        d[k] = f(d[k])
    return cls(**d)


# -- the command line -----------------------------------------------------------------------------

_CHECKED_PREFIXES = ("train", "checkpoint", "memory", "eval", "generate", "distributed", "hardware", "data", "planner")


TOOL_CONFIGS = {
    "lcx": "config",
    "lcx.train": "config",
    "lcx.extend": "config",
    "lcx.plan": "plan_config",
    "lcx.eval": "eval_config",
    "lcx.export": "export_config",
    "lcx.generate": "generate_config",
}
"""The primary config (``conf/<name>.yaml``) each entry point composes."""


@functools.cache
def top_level_keys(tool: str = "lcx") -> tuple[str, ...]:
    """Every top-level key a config of ``tool`` can hold: its primary config's keys and default
    groups, ``hydra``, and the top-level keys any experiment (``conf/experiment/*.yaml``) adds."""
    import importlib.resources

    from omegaconf import OmegaConf

    conf = importlib.resources.files("lcx.conf")
    primary = OmegaConf.to_container(OmegaConf.load(str(conf / f"{TOOL_CONFIGS.get(tool, 'config')}.yaml")))
    assert isinstance(primary, dict)
    keys = {"hydra", *primary}
    for entry in primary.get("defaults", []):
        if isinstance(entry, dict):
            keys |= {k.removeprefix("optional ").split("@")[0].split("/")[0] for k in entry}
    for exp in (conf / "experiment").iterdir():
        if exp.name.endswith(".yaml"):
            keys |= set(OmegaConf.to_container(OmegaConf.load(str(exp))) or {})
    return tuple(sorted(keys - {"defaults"}))


def check_overrides(argv: Sequence[str], tool: str = "lcx") -> None:
    """Refuse a command-line override of an unknown key in a checked section, naming the nearest
    valid key, before Hydra composes anything (Hydra's own refusal does not name it). ``data.*``
    keys are checked against the keys of every data config together (the selected one is known
    only after composition, where :func:`check_section` checks it exactly). A key appended with
    ``+`` under a top-level name no config of ``tool`` has (``+hardwre.chips=64``, ``+foo=1``)
    is refused too: nothing would read it (:func:`top_level_keys`).

    Raises:
      ValueError: the unknown key, the nearest valid one and the valid ones.
    """
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            continue
        key = arg.split("=", 1)[0].lstrip("+~")
        parts = key.split(".")
        roots = top_level_keys(tool) if arg.startswith("+") and "/" not in parts[0] else None
        if roots is not None and parts[0].split("@")[0] not in roots:
            near = nearest(parts[0], roots)
            hint = f"did you mean {near}? " if near else ""
            raise ValueError(
                f"{arg}: unknown top-level key {parts[0]!r}; {hint}a config of {tool} has {', '.join(roots)}, "
                "and nothing reads a key '+' appends elsewhere (a misspelt key is refused, never ignored)"
            )
        if len(parts) < 2 or parts[0] not in _CHECKED_PREFIXES or "@" in key or "/" in key:
            continue
        section, leaf = parts[0], parts[1]
        if section == "data":
            valid = sorted({f.name for s in DATA_CONFIGS.values() for f in dataclasses.fields(s)})
        elif section == "checkpoint" and tool in ("lcx.eval", "lcx.export", "lcx.generate"):
            valid = [f.name for f in dataclasses.fields(EvalCheckpointConfig)]
        else:
            valid = [f.name for f in dataclasses.fields(SECTIONS[section])]
        if leaf not in valid:
            raise ValueError(unknown_key_message(section, leaf, valid, tool))


__all__ = ["check_overrides", "check_section", "nearest", "typed", "unknown_key_message"]
