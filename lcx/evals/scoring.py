"""RULER's scoring rules and its effective context length, exactly as its reference code.

Source: RULER (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context
Language Models?", arXiv:2404.06654); github.com/NVIDIA/RULER, ``scripts/eval/evaluate.py``
(``postprocess_pred``) and ``scripts/eval/synthetic/constants.py`` (``string_match_all``,
``string_match_part``). A prediction is cleaned first: stripped, every C0 control character
(``\\x00``-``\\x1f``) turned into a line break, stripped again (:func:`clean`); nothing else is
cut (no stop word: the whole continuation is scored, up to the tokenizer's EOS, which the runner
applies when it decodes). A reference counts when it occurs in the cleaned prediction as a
substring, both lower-cased.

- ``all`` (RULER's ``string_match_all``; needle-in-a-haystack, variable tracking, common- and
  frequent-words extraction): per sample, the fraction of the references found, so a
  prediction naming 3 of 4 needles scores 0.75.
- ``part`` (RULER's ``string_match_part``; question answering): per sample, 1 if any reference
  is found, else 0.

A task's score (:func:`ruler_score`) is the mean of its samples' scores as a percentage rounded
to 2 decimals, RULER's ``round(sum(scores) / len(scores) * 100, 2)``: per sample a fraction in
[0, 1], per task (and per cell of lcx's grid) a percentage in [0, 100].

The effective context length (RULER's README and section 4): the longest length whose score
exceeds a threshold, Llama-2-7B's mean at its own 4K training length, 85.6
(:data:`RULER_THRESHOLD`; :func:`effective_length`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

RULER_THRESHOLD = 85.6
"""RULER's effective-length threshold, a percentage: Llama-2-7B's mean score at 4K (RULER's README)."""

METRICS = ("all", "part")
"""The scoring rules by name (module docstring)."""

_CONTROL = re.compile(r"[\x00-\x1f]")


def clean(prediction: str) -> str:
    """RULER's ``postprocess_pred``: ``prediction`` stripped, each C0 control character
    (``\\x00``-``\\x1f``) replaced by a line break, stripped again."""
    return _CONTROL.sub("\n", prediction.strip()).strip()


def match_all(prediction: str, references: Sequence[str]) -> float:
    """One sample of RULER's ``string_match_all``: the fraction (0-1) of ``references`` that occur
    in the cleaned ``prediction`` (:func:`clean`), both lower-cased.

    Raises:
      ValueError: no reference.
    """
    if not references:
        raise ValueError("match_all needs at least one reference answer, got none")
    p = clean(prediction).lower()
    return sum(1.0 if r.lower() in p else 0.0 for r in references) / len(references)


def match_part(prediction: str, references: Sequence[str]) -> float:
    """One sample of RULER's ``string_match_part``: 1.0 if any of ``references`` occurs in the
    cleaned ``prediction`` (:func:`clean`), both lower-cased, else 0.0.

    Raises:
      ValueError: no reference.
    """
    if not references:
        raise ValueError("match_part needs at least one reference answer, got none")
    p = clean(prediction).lower()
    return max(1.0 if r.lower() in p else 0.0 for r in references)


def score(prediction: str, references: Sequence[str], metric: str) -> float:
    """The score in [0, 1] of one sample under the rule ``metric`` (:data:`METRICS`).

    Raises:
      ValueError: an unknown ``metric`` (names the valid ones), or no reference.
    """
    if metric == "all":
        return match_all(prediction, references)
    if metric == "part":
        return match_part(prediction, references)
    raise ValueError(f"unknown scoring rule {metric!r}; use one of {', '.join(METRICS)}")


def ruler_score(sample_scores: Sequence[float]) -> float:
    """RULER's score of a task from its samples' scores: ``round(sum(s) / len(s) * 100, 2)``
    (``scripts/eval/synthetic/constants.py``), a percentage in [0, 100] with 2 decimals.

    Args:
      sample_scores: each sample's score in [0, 1] (:func:`score`), in sample order (Python's
        ``sum``, as RULER's).

    Raises:
      ValueError: no sample.
    """
    if not sample_scores:
        raise ValueError("a task score needs at least one sample, got none")
    return round(sum(sample_scores) / len(sample_scores) * 100, 2)


def string_match_all(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """RULER's ``string_match_all`` over samples: :func:`ruler_score` of :func:`match_all` per
    (prediction, references) pair, a percentage with 2 decimals.

    Raises:
      ValueError: no sample, a different number of predictions and references, or a sample
        without a reference.
    """
    return ruler_score([match_all(p, r) for p, r in _pairs(predictions, references)])


def string_match_part(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """RULER's ``string_match_part`` over samples: :func:`ruler_score` of :func:`match_part` per
    (prediction, references) pair, a percentage with 2 decimals.

    Raises:
      ValueError: as :func:`string_match_all`.
    """
    return ruler_score([match_part(p, r) for p, r in _pairs(predictions, references)])


def _pairs(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> list[tuple[str, Sequence[str]]]:
    if len(predictions) != len(references):
        raise ValueError(
            f"{len(predictions)} predictions for {len(references)} reference lists: one list per prediction"
        )
    return list(zip(predictions, references))


def effective_length(score_by_length: Mapping[int, float], threshold: float = RULER_THRESHOLD) -> int | None:
    """RULER's effective context length: the longest evaluated length whose score exceeds
    ``threshold`` (strictly: RULER's README counts a model "effectively handling" a length when
    it exceeds Llama-2-7B's 85.6 at 4K, and gives Llama-2-7B itself, at 85.6, none). A length
    that passes after a shorter one failed counts, as in RULER; lcx's report passes only the
    lengths at which every task ran (:func:`lcx.evals.runner.complete_lengths`).

    Args:
      score_by_length: score (percentage, 0-100; NaN counts as failing) by context length in
        tokens.
      threshold: the score to exceed, a percentage (default RULER's 85.6).

    Returns:
      the length in tokens, or None when no length exceeds ``threshold``.

    Raises:
      ValueError: no length, or ``threshold`` outside (1, 100] (a value <= 1 reads as a
        fraction: scores are percentages).
    """
    if not score_by_length:
        raise ValueError("effective_length needs at least one evaluated length, got none")
    check_threshold(threshold, "threshold")
    passed = [int(s) for s, v in score_by_length.items() if not math.isnan(v) and v > threshold]
    return max(passed) if passed else None


def check_threshold(threshold: float, key: str = "eval.threshold") -> None:
    """Refuse a threshold that is not a percentage in (1, 100].

    Raises:
      ValueError: outside (1, 100]; a value <= 1 is named as a fraction (RULER's is 85.6, not 0.856).
    """
    if not 1.0 < threshold <= 100.0:
        raise ValueError(
            f"{key}={threshold}: must be a percentage in (1, 100] on RULER's 0-100 scale "
            f"(RULER's is {RULER_THRESHOLD}; a fraction such as 0.856 reads as 0.856%: write 85.6)"
        )


__all__ = [
    "METRICS",
    "RULER_THRESHOLD",
    "check_threshold",
    "clean",
    "effective_length",
    "match_all",
    "match_part",
    "ruler_score",
    "score",
    "string_match_all",
    "string_match_part",
]
