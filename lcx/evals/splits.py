"""Evaluation and training draws that never meet: the two splits of every task's material.

A model trained here on the tasks' formats (``data=tasks``, :mod:`lcx.evals.training_rows`) and
then scored on them must be scored on material it never saw, or a score measures memory, not
retrieval. Every random piece of an example is therefore drawn from one of two disjoint splits:

- ``eval`` (what :mod:`lcx.eval` scores, and the default of every task): the haystack from the
  embedded corpus's validation documents (the split of ``data=stdlib`` / ``data=stdlib_bpe`` at
  their defaults, ``val_fraction=0.02``, ``split_seed=0``: 15 of 734 documents), and only keys,
  values and names whose CRC-32 is even;
- ``train``: the corpus's training documents, and only keys, values and names whose CRC-32 is odd.

A string's split is a function of the string alone (:func:`in_split`), so no list of used values
is kept and any two draws, whatever their seeds, are disjoint across the splits. The parity of a
hash carries no pattern a model could learn in the digits or letters themselves.
"""

from __future__ import annotations

import functools
import zlib

import numpy as np

SPLITS = ("eval", "train")
"""The two splits; ``eval`` is every task's default."""

CORPUS_VAL_FRACTION, CORPUS_SPLIT_SEED = 0.02, 0
"""The document split the haystacks follow: ``data=stdlib``'s defaults (``val_fraction``,
``split_seed``), so a run on the embedded corpus never trains on an ``eval`` haystack."""


def check_split(split: str) -> str:
    """``split`` itself.

    Raises:
      ValueError: not one of :data:`SPLITS`.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown task split {split!r}; use one of {', '.join(SPLITS)}")
    return split


def in_split(text: str, split: str) -> bool:
    """Whether the key, value or name ``text`` belongs to ``split``: its UTF-8 CRC-32 is even for
    ``eval``, odd for ``train``."""
    return (zlib.crc32(text.encode()) & 1) == SPLITS.index(check_split(split))


@functools.cache
def corpus_documents(split: str) -> tuple[int, ...]:
    """Indices into :func:`lcx.data.corpora.stdlib_corpus` of the haystack documents of
    ``split``: ``eval`` the validation documents, ``train`` the training documents of
    :func:`lcx.data.pipeline.split_documents` at :data:`CORPUS_VAL_FRACTION` /
    :data:`CORPUS_SPLIT_SEED`, empty documents left out, in corpus order."""
    from lcx.data.corpora import stdlib_corpus
    from lcx.data.pipeline import split_documents

    corpus = stdlib_corpus()
    train, val = split_documents(len(corpus), CORPUS_VAL_FRACTION, CORPUS_SPLIT_SEED)
    chosen = val if check_split(split) == "eval" else train
    return tuple(int(i) for i in chosen if corpus[int(i)])


def draw_in_split(rng: np.random.Generator, draw, split: str) -> str:
    """The first ``draw(rng)`` (a string) that belongs to ``split`` (:func:`in_split`); about two
    draws on average."""
    while True:
        s = draw(rng)
        if in_split(s, split):
            return s


__all__ = [
    "CORPUS_SPLIT_SEED",
    "CORPUS_VAL_FRACTION",
    "SPLITS",
    "check_split",
    "corpus_documents",
    "draw_in_split",
    "in_split",
]
