"""RULER's scoring rules and its effective context length.

Source: RULER (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context
Language Models?", arXiv:2404.06654; github.com/NVIDIA/RULER, ``scripts/eval/synthetic/constants.py``
and ``scripts/eval/evaluate.py``). A prediction is first cleaned (control characters become line
breaks, surrounding white space is stripped); matching ignores case.

- ``all`` (RULER's ``string_match_all``; needle-in-a-haystack, variable tracking, common- and
  frequent-words extraction): the fraction of the reference answers that occur in the
  prediction, so a prediction naming 3 of 4 needles scores 0.75.
- ``part`` (RULER's ``string_match_part``; question answering): 1 if any reference occurs in the
  prediction, else 0.

Scores here are fractions in [0, 1]; RULER prints them as percentages.

The effective context length (RULER section 4): the longest length at which the model's mean
score over the tasks stays at or above a threshold; RULER's threshold is Llama-2-7B's mean score
at its own 4K training length, 85.6% (RULER's results table), :data:`RULER_THRESHOLD`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

RULER_THRESHOLD = 0.856
"""RULER's effective-length threshold as a fraction: Llama-2-7B's mean score at 4K, 85.6%."""

METRICS = ("all", "part")
"""The scoring rules by name (module docstring)."""

_CONTROL = re.compile(r"[\x00-\x1f]")


def clean(prediction: str) -> str:
    """``prediction`` with control characters replaced by line breaks and outer white space
    stripped (RULER's post-processing of a generated answer)."""
    return _CONTROL.sub("\n", prediction).strip()


def match_all(prediction: str, references: Sequence[str]) -> float:
    """RULER's ``string_match_all``: the fraction (0-1) of ``references`` that occur in the
    cleaned ``prediction``, ignoring case.

    Raises:
      ValueError: no reference.
    """
    if not references:
        raise ValueError("match_all needs at least one reference answer, got none")
    p = clean(prediction).lower()
    return sum(r.lower() in p for r in references) / len(references)


def match_part(prediction: str, references: Sequence[str]) -> float:
    """RULER's ``string_match_part``: 1.0 if any of ``references`` occurs in the cleaned
    ``prediction`` (ignoring case), else 0.0.

    Raises:
      ValueError: no reference.
    """
    if not references:
        raise ValueError("match_part needs at least one reference answer, got none")
    p = clean(prediction).lower()
    return float(any(r.lower() in p for r in references))


def score(prediction: str, references: Sequence[str], metric: str) -> float:
    """The score in [0, 1] of one prediction under the rule ``metric`` (:data:`METRICS`).

    Raises:
      ValueError: an unknown ``metric`` (names the valid ones), or no reference.
    """
    if metric == "all":
        return match_all(prediction, references)
    if metric == "part":
        return match_part(prediction, references)
    raise ValueError(f"unknown scoring rule {metric!r}; use one of {', '.join(METRICS)}")


def effective_length(mean_by_length: Mapping[int, float], threshold: float = RULER_THRESHOLD) -> int | None:
    """The effective context length: the longest evaluated length ``L`` such that the mean score
    at ``L`` and at every shorter evaluated length is ``>= threshold`` (RULER: "the maximum length
    a model performs above the threshold"; a length that passes after one that failed does not
    count, as the context before it was not used).

    Args:
      mean_by_length: mean score (fraction, 0-1; NaN counts as failing) by context length in
        tokens.
      threshold: the score to reach, a fraction (default RULER's 0.856).

    Returns:
      the length in tokens, or None when even the shortest length falls below ``threshold``.

    Raises:
      ValueError: no length, or ``threshold`` outside (0, 1].
    """
    if not mean_by_length:
        raise ValueError("effective_length needs at least one evaluated length, got none")
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold={threshold}: must be a fraction in (0, 1] (RULER's is {RULER_THRESHOLD})")
    best = None
    for length in sorted(mean_by_length):
        s = mean_by_length[length]
        if math.isnan(s) or s < threshold:
            break
        best = int(length)
    return best


__all__ = ["METRICS", "RULER_THRESHOLD", "clean", "effective_length", "match_all", "match_part", "score"]
