"""Tokenizers: text <-> integer token ids. The default is byte-level UTF-8 (nothing downloaded).

Every tokenizer implements :class:`Tokenizer`; adding one is a new final subclass and one line in
:data:`TOKENIZERS`.
"""

from __future__ import annotations

import abc
from typing import final

import numpy as np


class Tokenizer(abc.ABC):
    """Maps text to token ids in ``[0, vocab_size)`` and back."""

    name: str

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """Number of distinct token ids (the model's embedding rows)."""

    @abc.abstractmethod
    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text``: int32 ``[T]`` (T tokens), every id in ``[0, vocab_size)``."""

    @abc.abstractmethod
    def decode(self, ids) -> str:
        """Text of the token ids ``ids`` (int ``[T]``, any integer dtype or a list of ints)."""


@final
class ByteTokenizer(Tokenizer):
    """Byte-level tokenizer: one token per UTF-8 byte, vocabulary of 256.

    ``decode(encode(s)) == s`` for every string ``s``. Decoding an arbitrary id sequence (for
    example model samples) that is not valid UTF-8 replaces the invalid bytes with U+FFFD rather
    than failing; corpora, in contrast, are decoded strictly when they are read.
    """

    name = "byte"

    @property
    def vocab_size(self) -> int:
        return 256

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

    def decode(self, ids) -> str:
        arr = np.asarray(ids)
        if arr.size and (arr.min() < 0 or arr.max() > 255):
            raise ValueError(f"byte tokenizer ids must lie in [0, 255], got range [{arr.min()}, {arr.max()}]")
        return arr.astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return "ByteTokenizer()"


TOKENIZERS: dict[str, type[Tokenizer]] = {"byte": ByteTokenizer}


def get_tokenizer(name: str) -> Tokenizer:
    """The tokenizer registered as ``name`` (``data.tokenizer`` in the config).

    Raises:
      ValueError: unknown name; the message lists the registered ones.
    """
    if name not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer {name!r}; set data.tokenizer to one of {sorted(TOKENIZERS)}")
    return TOKENIZERS[name]()
