"""Finding and reading a Hugging Face tokenizer on disk, for :class:`lcx.data.tokenizers.HFTokenizer`.

``data.tokenizer`` may name a ``tokenizer.json`` file or a model directory holding one.
:func:`tokenizer_files` finds the files and reads, from a directory, the two small JSON files
beside ``tokenizer.json`` that carry the BOS/EOS configuration:

- ``tokenizer_config.json``: ``bos_token``, ``eos_token``, ``add_bos_token``, ``add_eos_token``;
- ``special_tokens_map.json``: ``bos_token``, ``eos_token`` (where ``tokenizer_config.json``
  does not name them; where both name a token they must agree).

No other key of either file is read. A file path is read alone: its siblings are not looked at
(name the directory to have them read). Every error names the path and what was wrong.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"


@dataclasses.dataclass(frozen=True)
class TokenizerFiles:
    """What :func:`tokenizer_files` found.

    Attributes:
      tokenizer_json: the ``tokenizer.json`` file (absolute).
      bos_token, eos_token: the BOS and EOS token strings the config files name (None: unnamed).
      add_bos, add_eos: ``tokenizer_config.json``'s ``add_bos_token`` / ``add_eos_token`` (None:
        absent).
      read: the config files read, for messages and logs.
    """

    tokenizer_json: pathlib.Path
    bos_token: str | None = None
    eos_token: str | None = None
    add_bos: bool | None = None
    add_eos: bool | None = None
    read: tuple[str, ...] = ()


def _json_object(path: pathlib.Path) -> dict[str, Any]:
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not a JSON file ({e}); lcx reads Hugging Face tokenizer files") from None
    if not isinstance(d, dict):
        raise ValueError(
            f"{path} holds a JSON {type(d).__name__}, not an object; lcx reads Hugging Face tokenizer files"
        )
    return d


def _token(d: dict[str, Any], key: str, path: pathlib.Path) -> str | None:
    """A token string as transformers writes it: a string, ``{"content": ...}`` (an AddedToken)
    or null."""
    v = d.get(key)
    if isinstance(v, dict):
        v = v.get("content")
    if v is None or isinstance(v, str):
        return v
    raise ValueError(f"{path}: {key}={v!r} is not a token string (nor {{'content': str}}); fix or remove the key")


def _flag(d: dict[str, Any], key: str, path: pathlib.Path) -> bool | None:
    v = d.get(key)
    if v is None or isinstance(v, bool):
        return v
    raise ValueError(f"{path}: {key}={v!r} is not true, false or null; fix the file")


def check_tokenizer_json(path: pathlib.Path) -> None:
    """Refuse a file that is not a Hugging Face ``tokenizer.json`` (not a JSON object with a
    ``model``), before the ``tokenizers`` library gives its terser message.

    Raises:
      ValueError: names the path and what it holds instead.
    """
    d = _json_object(path)
    if not isinstance(d.get("model"), dict):
        keys = ", ".join(sorted(d)[:8]) or "no keys"
        raise ValueError(
            f"{path} is not a Hugging Face tokenizer.json: it has no 'model' object (its keys: {keys}); "
            f"set data.tokenizer to a tokenizer.json or a model directory holding one"
        )


def tokenizer_files(path: str | pathlib.Path) -> TokenizerFiles:
    """The tokenizer at ``path`` (a ``tokenizer.json``, or a directory holding one) and, for a
    directory, the BOS/EOS keys of its ``tokenizer_config.json`` and ``special_tokens_map.json``.

    Args:
      path: absolute or relative to the current directory; ``~`` expands.

    Returns:
      :class:`TokenizerFiles`.

    Raises:
      FileNotFoundError: ``path`` does not exist, or the directory holds no ``tokenizer.json``
        (a ``tokenizer.model`` alone, SentencePiece's, is named with the conversion to run).
      ValueError: a file that is not JSON, or a key of the wrong type (names the file and key).
    """
    p = pathlib.Path(path).expanduser().absolute()
    if not p.exists():
        raise FileNotFoundError(
            f"data.tokenizer={str(path)!r}: no such file or directory ({p}); give a tokenizer.json, "
            f"a model directory holding one, or a registered name"
        )
    if p.is_file():
        return TokenizerFiles(tokenizer_json=p)
    file = p / TOKENIZER_JSON
    if not file.is_file():
        has = sorted(x.name for x in p.iterdir())[:12]
        hint = (
            " (it has SentencePiece's tokenizer.model: write a tokenizer.json with transformers' "
            "AutoTokenizer.from_pretrained(dir).save_pretrained(dir))"
            if "tokenizer.model" in has
            else ""
        )
        raise FileNotFoundError(
            f"data.tokenizer={str(path)!r}: the directory {p} holds no {TOKENIZER_JSON}{hint}; it has "
            f"{', '.join(has) or 'nothing'}"
        )
    found: dict[str, Any] = {}
    read = []
    for name in (SPECIAL_TOKENS_MAP, TOKENIZER_CONFIG):
        f = p / name
        if not f.is_file():
            continue
        d = _json_object(f)
        read.append(name)
        for key in ("bos_token", "eos_token"):
            tok = _token(d, key, f)
            if tok is not None and found.get(key, tok) != tok:
                raise ValueError(
                    f"{p}: {SPECIAL_TOKENS_MAP} names {key}={found[key]!r}, {TOKENIZER_CONFIG} {key}={tok!r}; "
                    f"make the two files agree (lcx picks neither silently)"
                )
            if tok is not None:
                found[key] = tok
        if name == TOKENIZER_CONFIG:
            found["add_bos"] = _flag(d, "add_bos_token", f)
            found["add_eos"] = _flag(d, "add_eos_token", f)
    return TokenizerFiles(tokenizer_json=file, read=tuple(read), **found)


__all__ = [
    "SPECIAL_TOKENS_MAP",
    "TOKENIZER_CONFIG",
    "TOKENIZER_JSON",
    "TokenizerFiles",
    "check_tokenizer_json",
    "tokenizer_files",
]
