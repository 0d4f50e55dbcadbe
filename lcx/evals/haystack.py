"""The haystack and word pools of the long-context tasks: lcx's embedded real text.

The haystack is the embedded standard-library snapshot (:func:`lcx.data.corpora.stdlib_corpus`,
734 real documents, 12.1 MB), not RULER's repeated "the grass is green" noise: documents are
taken in corpus order from a start document drawn from the example's generator, each followed by
a blank line, encoded with the run's tokenizer, and cut to the exact number of tokens asked for.
The words of the key and word-list tasks are the lowercase words of the same corpus.
"""

from __future__ import annotations

import collections
import functools
import re

import numpy as np

from lcx.data.corpora import stdlib_corpus
from lcx.data.tokenizers import Tokenizer

SEPARATOR = "\n\n"
"""Text put after each haystack document."""

WORD_LENGTHS = (4, 8)
"""Shortest and longest word of :func:`word_pool`, in letters."""

MIN_COUNT = 20
"""Occurrences in the corpus a word of :func:`word_pool` has at least (no rare hex or typos)."""


@functools.lru_cache(maxsize=256)
def _document_tokens(tokenizer: Tokenizer, index: int) -> np.ndarray:
    return tokenizer.encode(stdlib_corpus()[index] + SEPARATOR)


def haystack_tokens(tokenizer: Tokenizer, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` tokens of real text: the embedded corpus from a start document drawn from ``rng``.

    Args:
      tokenizer: the run's tokenizer.
      n: tokens wanted, ``>= 0``.
      rng: the example's generator (one draw: the start document).

    Returns:
      int32 ``[n]`` token ids.
    """
    corpus = stdlib_corpus()
    i = int(rng.integers(len(corpus)))
    parts, have = [], 0
    while have < n:
        t = _document_tokens(tokenizer, i % len(corpus))
        parts.append(t[: n - have])
        have += parts[-1].size
        i += 1
    return np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, np.int32)


@functools.cache
def word_pool() -> tuple[str, ...]:
    """The lowercase words of 4 to 8 letters (:data:`WORD_LENGTHS`) that occur at least
    :data:`MIN_COUNT` times in the embedded corpus (English of its comments and docstrings, and
    common identifiers), sorted (about 2 s, cached): the keys of the needle-in-a-haystack tasks
    and the words of common-words extraction."""
    lo, hi = WORD_LENGTHS
    pat = re.compile(rf"(?<![A-Za-z0-9_])[a-z]{{{lo},{hi}}}(?![A-Za-z0-9_])")
    counts: collections.Counter[str] = collections.Counter()
    for doc in stdlib_corpus():
        counts.update(pat.findall(doc))
    return tuple(sorted(w for w, c in counts.items() if c >= MIN_COUNT))


def draw_words(rng: np.random.Generator, k: int) -> list[str]:
    """``k`` distinct words of :func:`word_pool`, drawn from ``rng``."""
    pool = word_pool()
    return [pool[i] for i in rng.choice(len(pool), size=k, replace=False)]


__all__ = ["MIN_COUNT", "SEPARATOR", "WORD_LENGTHS", "draw_words", "haystack_tokens", "word_pool"]
