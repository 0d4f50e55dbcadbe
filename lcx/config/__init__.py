"""lcx's structured configs: :func:`register` (the schemas and resolvers Hydra composes with) and
the checks of single values the entry points read.

The YAML tree is not here: it lives in the repository's top-level ``conf/``, installed as the data
package ``lcx.conf`` (pyproject ``[tool.setuptools] package-dir``) and found by Hydra through
``pkg://lcx.conf``. Importing this package registers nothing; the entry points call
:func:`register` (:func:`lcx.cli.launch`), and so must any code that composes with Hydra's
``compose`` API (tests/conftest.py does, for the tests).

:func:`positive_int` is the one check of the whole-number settings the entry points read
(``train.seq_len``, ``train.global_batch``, ``train.steps``, ``hardware.chips``), and
:func:`boolean` the check of on/off settings (``train.check_memory``).
"""

import secrets
from typing import Any

from omegaconf import OmegaConf


def register() -> None:
    """Register, once per process (later calls change nothing), what the YAML tree refers to:

    - ``plan/schema`` (:func:`lcx.sharding.config.register_schema`), the base of every ``plan=`` preset;
    - ``schema/<name>`` (:func:`lcx.config.sections.register_schemas`): train, checkpoint, data, ...;
    - the ``${lcx_uid:}`` resolver: six random hex digits, drawn once per process (cached), in the
      default run and sweep directories next to a microsecond time, so two runs launched in the
      same second (or the same microsecond, on two machines sharing a file system) never share a
      directory.
    """
    from lcx.config.sections import register_schemas
    from lcx.sharding.config import register_schema

    register_schema()
    register_schemas()
    if not OmegaConf.has_resolver("lcx_uid"):
        OmegaConf.register_new_resolver("lcx_uid", lambda: secrets.token_hex(3), use_cache=True)


def positive_int(value: Any, key: str, what: str = "a count") -> int:
    """``value`` as an int >= 1, or ValueError naming ``key`` (a float with a fraction, a string
    or a value < 1 is refused, never rounded).

    Raises:
      ValueError: ``value`` is not a whole number, or is below 1.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ValueError(f"{key}={value!r}: must be a whole number >= 1 ({what})")
    if value < 1:
        raise ValueError(f"{key}={value}: must be >= 1 ({what})")
    return value


def boolean(value: Any, key: str, what: str = "on or off") -> bool:
    """``value`` if it is a bool, else ValueError naming ``key``.

    Hydra parses only ``true``/``false`` as booleans: ``key=no`` or ``key=off`` arrive as the
    strings "no"/"off", which Python treats as true, so they are refused, never guessed at.

    Raises:
      ValueError: ``value`` is not a bool.
    """
    if not isinstance(value, bool):
        raise ValueError(f"{key}={value!r}: must be true or false ({what}); write {key}=true or {key}=false")
    return value


__all__ = ["boolean", "positive_int", "register"]
