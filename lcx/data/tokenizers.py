"""Tokenizers: text <-> integer token ids. The default is byte-level UTF-8 (nothing downloaded).

``data.tokenizer`` is a registered name (:data:`TOKENIZERS`: ``byte``, ``stdlib_bpe``), or the
path of a Hugging Face ``tokenizer.json`` or of a model directory holding one
(:class:`HFTokenizer`, through Hugging Face's ``tokenizers`` library). Every tokenizer implements
:class:`Tokenizer`; adding one is a new final subclass and one line in :data:`TOKENIZERS`.

BOS and EOS per document (:meth:`Tokenizer.encode_documents`) follow one rule, for every
tokenizer: the text is encoded WITHOUT the tokenizer's special tokens, then lcx puts the BOS id
before it and the EOS id after it where ``add_bos`` / ``add_eos`` say so. Their defaults are the
tokenizer's own configuration (:class:`HFTokenizer` says which file says what); ``data.add_bos``
/ ``data.add_eos`` override them (null: the tokenizer's own). So a Llama 3 tokenizer.json, whose
post-processor itself adds ``<|begin_of_text|>``, gets exactly one BOS, never two.

A model trained from scratch takes its vocabulary from the tokenizer (``model.vocab_size: null``):
:func:`padded_vocab_size` of :attr:`Tokenizer.vocab_size`; :func:`check_model_vocab` refuses an
explicit one with fewer rows. The derivation happens once, at the config edge
(:func:`lcx.config.run.run_config`).
"""

from __future__ import annotations

import abc
import importlib.resources
import logging
import os
import pathlib
from collections.abc import Callable, Sequence
from typing import Any, final

import numpy as np

from lcx.data.tokenizer_files import TOKENIZER_CONFIG, check_tokenizer_json, tokenizer_files

log = logging.getLogger(__name__)

VOCAB_MULTIPLE = 128
"""A vocabulary taken from the tokenizer is padded up to a multiple of this many ids. The
embedding ``[V, D]`` and the output head ``[D, V]`` shard their vocab axis over mesh axes
(``plan.params.vocab``; :meth:`lcx.sharding.Plan.validate` refuses a V the product of those axes
does not divide): 128 is divided by every power-of-two mesh product up to 128 devices, and is
the TPU's lane width, so the head's matmul tiles evenly. The padding ids are never produced by
the tokenizer; their logits only learn to be small."""

STDLIB_BPE = "stdlib_bpe.json"
"""The embedded BPE (``data.tokenizer=stdlib_bpe``, ``data=stdlib_bpe``), a file of the package
``lcx.data``: byte-level BPE, 4,096 ids, trained on the training split of the embedded standard
library by ``experiments/make_stdlib_bpe.py`` (docs/data.md has its command and numbers)."""

STDLIB_BPE_SHA256 = "d05acfbfdf3ff8cce0a7e9ac38efc9d710ca0436f671921778ea0ab9a8ca992e"
"""sha256 of :data:`STDLIB_BPE` (tests/test_tokenizers.py checks the shipped file against it)."""


def padded_vocab_size(n: int, multiple: int = VOCAB_MULTIPLE) -> int:
    """``n`` ids rounded up to a multiple of ``multiple`` (:data:`VOCAB_MULTIPLE` says why):
    256 -> 256, 4,096 -> 4,096, 128,256 -> 128,256, 50,257 -> 50,304."""
    return -(-int(n) // multiple) * multiple


class Tokenizer(abc.ABC):
    """Maps text to token ids in ``[0, vocab_size)`` and back.

    Attributes:
      name: what ``data.tokenizer`` named (a registered name or a path).
      bos_id, eos_id: the BOS and EOS token ids (None: the tokenizer has none).
      add_bos, add_eos: whether :meth:`encode_documents` puts ``bos_id`` before, ``eos_id``
        after, each document.
    """

    name: str
    bos_id: int | None = None
    eos_id: int | None = None
    add_bos: bool = False
    add_eos: bool = False

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """Largest token id + 1: the fewest embedding rows a model using this tokenizer needs."""

    @abc.abstractmethod
    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text`` alone (no BOS/EOS): int32 ``[T]``, every id in ``[0, vocab_size)``."""

    @abc.abstractmethod
    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """:meth:`encode` of each text: one int32 ``[T_i]`` array per text, in order."""

    @abc.abstractmethod
    def decode(self, ids) -> str:
        """Text of the token ids ``ids`` (int ``[T]``, any integer dtype or a list of ints)."""

    def encode_documents(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Each text as one training document: ``[bos_id] if add_bos`` + :meth:`encode_batch`'s
        ids + ``[eos_id] if add_eos``. An empty text stays empty (no document), so the
        tokenizer does not change which documents a corpus has.

        Returns:
          one int32 ``[T_i]`` array per text, in order.
        """
        docs = self.encode_batch(texts)
        pre = np.asarray([self.bos_id] if self.add_bos else [], np.int32)
        post = np.asarray([self.eos_id] if self.add_eos else [], np.int32)
        if not pre.size and not post.size:
            return docs
        return [np.concatenate([pre, d, post]) if d.size else d for d in docs]


def _choose(tokenizer: str, what: str, requested: bool | None, own: Callable[[], bool], token: int | None) -> bool:
    """``data.add_<what>`` if set, else the tokenizer's own rule (``own()``, called only then)."""
    add = own() if requested is None else bool(requested)
    if add and token is None:
        raise ValueError(
            f"data.add_{what}=true, but data.tokenizer={tokenizer} has no {what.upper()} token; set "
            f"data.add_{what}=null (the tokenizer's own rule) or false, or use a tokenizer that has one"
        )
    return add


@final
class ByteTokenizer(Tokenizer):
    """Byte-level tokenizer: one token per UTF-8 byte, vocabulary of 256, no BOS or EOS.

    ``decode(encode(s)) == s`` for every string ``s``. Decoding an arbitrary id sequence (for
    example model samples) that is not valid UTF-8 replaces the invalid bytes with U+FFFD rather
    than failing; corpora, in contrast, are decoded strictly when they are read.

    Args:
      add_bos: ``data.add_bos``; only None or False (all 256 ids are bytes, none is free for
        BOS).
      add_eos: ``data.add_eos``; only None or False (likewise no id is free for EOS).

    Raises:
      ValueError: ``add_bos`` or ``add_eos`` true.
    """

    name = "byte"

    def __init__(self, *, add_bos: bool | None = None, add_eos: bool | None = None):
        self.add_bos = _choose("byte", "bos", add_bos, lambda: False, None)
        self.add_eos = _choose("byte", "eos", add_eos, lambda: False, None)

    @property
    def vocab_size(self) -> int:
        return 256

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [self.encode(t) for t in texts]

    def decode(self, ids) -> str:
        arr = np.asarray(ids)
        if arr.size and (arr.min() < 0 or arr.max() > 255):
            raise ValueError(f"byte tokenizer ids must lie in [0, 255], got range [{arr.min()}, {arr.max()}]")
        return arr.astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return "ByteTokenizer()"


_PROBE = "lcx probes the post-processor"


@final
class HFTokenizer(Tokenizer):
    """A Hugging Face ``tokenizer.json``, loaded and run by the ``tokenizers`` library (Rust;
    :meth:`encode_batch` encodes on its native threads, ``TOKENIZERS_PARALLELISM`` as usual).

    What is read (:mod:`lcx.data.tokenizer_files`): the ``tokenizer.json``; for a directory
    also ``tokenizer_config.json`` (``bos_token``, ``eos_token``, ``add_bos_token``,
    ``add_eos_token``) and ``special_tokens_map.json`` (``bos_token``, ``eos_token``). The
    tokenizer.json's truncation and padding settings are switched off (a document is never cut).

    The BOS/EOS rule (the module docstring says why one rule): text is encoded with
    ``add_special_tokens=False``; then

    - ``bos_id``: the id of the config files' ``bos_token``; without one, the single special
      token the tokenizer.json's post-processor puts before a text (seen by encoding a probe
      text with and without special tokens); else None. ``eos_id`` likewise, after the text.
    - ``add_bos`` (``add_eos``): ``data.add_bos`` if set; else whether the post-processor adds
      the BOS token (Llama 3's adds ``<|begin_of_text|>``; GPT-2's adds nothing), which is what
      transformers' ``AutoTokenizer`` adds (tests/fixtures/hf_tokenizer_parity). Where
      ``tokenizer_config.json`` has ``add_bos_token`` it must agree with the post-processor, or
      the tokenizer is refused: transformers 4's Llama-family classes rebuilt the post-processor
      from the flag, transformers 5 drops the flag when a tokenizer.json exists, so the two
      would encode differently and lcx follows neither silently. Files saved by transformers
      agree.

    Args:
      path: a ``tokenizer.json`` or a directory holding one.
      add_bos: ``data.add_bos``; None: the tokenizer's own rule.
      add_eos: ``data.add_eos``; None: the tokenizer's own rule.
      name: the name for messages (default: ``path``).

    Raises:
      FileNotFoundError: ``path`` does not exist, or the directory has no ``tokenizer.json``.
      ValueError: a file that is not a tokenizer.json (or a config file of the wrong form), a
        BOS/EOS token the vocabulary lacks, ``add_bos``/``add_eos`` true without such a token; or,
        where the rule is left to the tokenizer (``add_bos``/``add_eos`` None), a post-processor
        that adds something other than one BOS / one EOS token, or an ``add_bos_token`` /
        ``add_eos_token`` that disagrees with it (names the ids; set ``data.add_bos`` /
        ``data.add_eos``).
    """

    def __init__(
        self, path: str | pathlib.Path, *, add_bos: bool | None = None, add_eos: bool | None = None, name=None
    ):
        import tokenizers

        files = tokenizer_files(path)
        self.name = str(path) if name is None else name
        self.path = files.tokenizer_json
        check_tokenizer_json(self.path)
        try:
            tok = tokenizers.Tokenizer.from_file(str(self.path))
        except Exception as e:  # the library raises a bare Exception
            raise ValueError(
                f"{self.path} is not a tokenizer.json that tokenizers {tokenizers.__version__} reads: {e}"
            ) from None
        tok.no_truncation()
        tok.no_padding()
        self._tok = tok
        ids = tok.get_vocab(with_added_tokens=True).values()
        if not ids:
            raise ValueError(f"{self.path}: the tokenizer has an empty vocabulary")
        self._vocab_size = max(ids) + 1
        plain = tok.encode(_PROBE, add_special_tokens=False).ids
        full = tok.encode(_PROBE, add_special_tokens=True).ids
        at = next((i for i in range(len(full) - len(plain) + 1) if full[i : i + len(plain)] == plain), None)
        if not plain or at is None:
            raise ValueError(f"{self.path}: the post-processor changes the text's own ids ({plain} -> {full})")
        before, after = full[:at], full[at + len(plain) :]
        self.bos_id = self._id(files.bos_token) if files.bos_token else (before[0] if len(before) == 1 else None)
        self.eos_id = self._id(files.eos_token) if files.eos_token else (after[0] if len(after) == 1 else None)

        def own(what: str, flag: bool | None, added: list[int], token: int | None) -> Callable[[], bool]:
            def rule() -> bool:
                where = "before" if what == "bos" else "after"
                if added and added != [token]:
                    raise ValueError(
                        f"{self.path}: the post-processor adds ids {added} {where} each text, not one "
                        f"{what.upper()} token ({token}); lcx adds BOS/EOS by id itself: set "
                        f"data.add_{what}=true or false"
                    )
                if flag is not None and flag != bool(added):
                    raise ValueError(
                        f"{self.path.parent / TOKENIZER_CONFIG} says add_{what}_token={str(flag).lower()}, but the "
                        f"post-processor of {self.path} {'adds' if added else 'does not add'} {what.upper()} "
                        f"{token} {where} each text (transformers 4's Llama tokenizers followed the flag, transformers "
                        f"5 follows the post-processor); set data.add_{what}=true or false"
                    )
                return bool(added)

            return rule

        self.add_bos = _choose(self.name, "bos", add_bos, own("bos", files.add_bos, before, self.bos_id), self.bos_id)
        self.add_eos = _choose(self.name, "eos", add_eos, own("eos", files.add_eos, after, self.eos_id), self.eos_id)
        log.info(
            "tokenizer %s: %d ids, BOS %s %s, EOS %s %s (config files read: %s)",
            self.path,
            self._vocab_size,
            self.bos_id,
            "added" if self.add_bos else "not added",
            self.eos_id,
            "added" if self.add_eos else "not added",
            ", ".join(files.read) or "none",
        )

    def _id(self, token: str) -> int:
        i = self._tok.token_to_id(token)
        if i is None:
            raise ValueError(f"{self.path}: the config names the special token {token!r}, which its vocabulary lacks")
        return int(i)

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, np.int32)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        encodings = self._tok.encode_batch(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, np.int32) for e in encodings]

    def decode(self, ids) -> str:
        arr = np.asarray(ids).reshape(-1)
        if arr.size and (arr.min() < 0 or arr.max() >= self._vocab_size):
            raise ValueError(
                f"{self.name}: ids must lie in [0, {self._vocab_size - 1}], got range [{arr.min()}, {arr.max()}]"
            )
        return self._tok.decode([int(i) for i in arr], skip_special_tokens=False)

    def __repr__(self) -> str:
        return f"HFTokenizer({self.name!r}, add_bos={self.add_bos}, add_eos={self.add_eos})"


def stdlib_bpe(*, add_bos: bool | None = None, add_eos: bool | None = None) -> HFTokenizer:
    """The embedded BPE (:data:`STDLIB_BPE`) as an :class:`HFTokenizer` named ``stdlib_bpe``."""
    path = pathlib.Path(str(importlib.resources.files("lcx.data") / STDLIB_BPE))
    return HFTokenizer(path, add_bos=add_bos, add_eos=add_eos, name="stdlib_bpe")


TOKENIZERS: dict[str, Callable[..., Tokenizer]] = {"byte": ByteTokenizer, "stdlib_bpe": stdlib_bpe}
"""The registered tokenizers, by name; each is called with ``add_bos=``, ``add_eos=``."""


def get_tokenizer(name: str, *, add_bos: bool | None = None, add_eos: bool | None = None) -> Tokenizer:
    """The tokenizer ``data.tokenizer`` names: a name in :data:`TOKENIZERS`, else a path
    (:class:`HFTokenizer`; relative to the current directory).

    Args:
      name: ``data.tokenizer``.
      add_bos: ``data.add_bos`` (None: the tokenizer's own rule).
      add_eos: ``data.add_eos`` (None: the tokenizer's own rule).

    Raises:
      ValueError: an unknown name (neither registered nor an existing path; lists the registered
        ones), and what :class:`HFTokenizer` / :class:`ByteTokenizer` refuse.
      FileNotFoundError: a path (it has a ``/`` or ends in ``.json``) that does not exist.
    """
    if name in TOKENIZERS:
        return TOKENIZERS[name](add_bos=add_bos, add_eos=add_eos)
    pathlike = "/" in name or os.sep in name or name.endswith(".json") or name.startswith("~")
    if not pathlike and not os.path.exists(name):
        raise ValueError(
            f"unknown tokenizer {name!r}; set data.tokenizer to one of {sorted(TOKENIZERS)}, or to a "
            f"tokenizer.json or a model directory holding one"
        )
    return HFTokenizer(name, add_bos=add_bos, add_eos=add_eos)


def check_model_vocab(vocab_size: int, tokenizer: Tokenizer, model: str = "the model") -> None:
    """Refuse a model whose embedding has fewer rows than ``tokenizer``'s largest id + 1.

    Raises:
      ValueError: names both numbers and the fix (``model.vocab_size=null``: the tokenizer's,
        padded by :func:`padded_vocab_size`).
    """
    need = tokenizer.vocab_size
    if vocab_size < need:
        raise ValueError(
            f"model.vocab_size={vocab_size} ({model}) is smaller than data.tokenizer={tokenizer.name}'s "
            f"{need} ids (largest id {need - 1}): the embedding has no row for ids >= {vocab_size}; set "
            f"model.vocab_size=null (the tokenizer's, padded to a multiple of {VOCAB_MULTIPLE}: "
            f"{padded_vocab_size(need)}) or any value >= {need}, or use a tokenizer whose ids fit"
        )


def data_tokenizer(data: Any) -> Tokenizer:
    """The tokenizer of a ``data`` config (:mod:`lcx.data.config`): ``data.tokenizer`` with its
    ``add_bos`` / ``add_eos`` where the config has them."""
    return get_tokenizer(data.tokenizer, add_bos=getattr(data, "add_bos", None), add_eos=getattr(data, "add_eos", None))


__all__ = [
    "STDLIB_BPE",
    "STDLIB_BPE_SHA256",
    "TOKENIZERS",
    "VOCAB_MULTIPLE",
    "ByteTokenizer",
    "HFTokenizer",
    "Tokenizer",
    "check_model_vocab",
    "data_tokenizer",
    "get_tokenizer",
    "padded_vocab_size",
    "stdlib_bpe",
]
