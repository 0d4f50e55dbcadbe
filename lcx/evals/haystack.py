"""The haystack and word pools of the long-context tasks: lcx's embedded real text.

The haystack is the embedded standard-library snapshot (:func:`lcx.data.corpora.stdlib_corpus`,
734 real documents, 12.1 MB), not RULER's repeated "the grass is green" noise: the documents of
one split (:mod:`lcx.evals.splits`: the validation documents for evaluation, the training ones
for ``data=tasks``) are taken in corpus order from a start document drawn from the example's
generator, each followed by a blank line, encoded with the run's tokenizer, and cut to the exact
number of tokens asked for. The words of the key and word-list tasks are the lowercase words of
the same corpus, those of the split (:func:`lcx.evals.splits.in_split`).
"""

from __future__ import annotations

import collections
import functools
import re

import numpy as np

from lcx.data.corpora import stdlib_corpus
from lcx.data.tokenizers import Tokenizer
from lcx.evals.splits import corpus_documents, in_split

SEPARATOR = "\n\n"
"""Text put after each haystack document."""

WORD_LENGTHS = (4, 8)
"""Shortest and longest word of :func:`word_pool`, in letters."""

MIN_COUNT = 20
"""Occurrences in the corpus a word of :func:`word_pool` has at least (no rare hex or typos)."""


@functools.lru_cache(maxsize=1024)
def _document_tokens(tokenizer: Tokenizer, index: int) -> np.ndarray:
    return tokenizer.encode(stdlib_corpus()[index] + SEPARATOR)


def haystack_tokens(tokenizer: Tokenizer, n: int, rng: np.random.Generator, split: str = "eval") -> np.ndarray:
    """``n`` tokens of real text: the documents of ``split`` from a start document drawn from ``rng``.

    Args:
      tokenizer: the run's tokenizer.
      n: tokens wanted, ``>= 0``.
      rng: the example's generator (one draw: the start document).
      split: ``eval`` (the corpus's validation documents) or ``train`` (:mod:`lcx.evals.splits`).

    Returns:
      int32 ``[n]`` token ids.
    """
    docs = corpus_documents(split)
    i = int(rng.integers(len(docs)))
    parts, have = [], 0
    while have < n:
        t = _document_tokens(tokenizer, docs[i % len(docs)])
        parts.append(t[: n - have])
        have += parts[-1].size
        i += 1
    return np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, np.int32)


@functools.cache
def word_pool(split: str | None = None) -> tuple[str, ...]:
    """The lowercase words of 4 to 8 letters (:data:`WORD_LENGTHS`) that occur at least
    :data:`MIN_COUNT` times in the embedded corpus (English of its comments and docstrings, and
    common identifiers), sorted (about 2 s, cached): with ``split``, those of that split
    (:func:`lcx.evals.splits.in_split`): the keys of the needle-in-a-haystack tasks and the words
    of common-words extraction."""
    if split is not None:
        return tuple(w for w in word_pool() if in_split(w, split))
    lo, hi = WORD_LENGTHS
    pat = re.compile(rf"(?<![A-Za-z0-9_])[a-z]{{{lo},{hi}}}(?![A-Za-z0-9_])")
    counts: collections.Counter[str] = collections.Counter()
    for doc in stdlib_corpus():
        counts.update(pat.findall(doc))
    return tuple(sorted(w for w, c in counts.items() if c >= MIN_COUNT))


def long_documents(
    tokenizer: Tokenizer, count: int, min_tokens: int, *, val_fraction: float = 0.02, split_seed: int = 0
) -> list[np.ndarray]:
    """Up to ``count`` held-out documents of the embedded corpus with at least ``min_tokens``
    tokens, longest first (ties by corpus order), each cut to ``min_tokens`` tokens: the
    documents of the perplexity-by-position curve. Held out means the validation split of
    ``data=stdlib`` / ``data=stdlib_bpe`` (:func:`lcx.data.pipeline.split_documents` with the
    same ``val_fraction`` and ``split_seed``), which a run on the embedded corpus never trains on.

    Returns:
      int32 ``[min_tokens]`` arrays, at least one.

    Raises:
      ValueError: ``count < 1``, or no held-out document is that long (names the longest).
    """
    from lcx.data.pipeline import split_documents

    if count < 1:
        raise ValueError(f"eval.perplexity_docs={count}: must be >= 1 (0 turns the curve off)")
    corpus = stdlib_corpus()
    _, val = split_documents(len(corpus), val_fraction, split_seed)
    docs = sorted((tokenizer.encode(corpus[int(i)]) for i in val), key=lambda d: -d.size)
    out = [d[:min_tokens].astype(np.int32) for d in docs[:count] if d.size >= min_tokens]
    if not out:
        raise ValueError(
            f"no held-out document of the embedded corpus has {min_tokens} tokens of tokenizer "
            f"{tokenizer.name} (the longest has {docs[0].size}); use shorter eval.lengths"
        )
    return out


def draw_words(rng: np.random.Generator, k: int, split: str = "eval") -> list[str]:
    """``k`` distinct words of ``split``'s :func:`word_pool`, drawn from ``rng``."""
    pool = word_pool(split)
    return [pool[i] for i in rng.choice(len(pool), size=k, replace=False)]


__all__ = ["MIN_COUNT", "SEPARATOR", "WORD_LENGTHS", "draw_words", "haystack_tokens", "long_documents", "word_pool"]
