"""Prompts of an exact number of tokens: a template, a real-text haystack and the answer budget.

Every task builds its prompt from pieces encoded separately with the run's tokenizer and joined
as token arrays (never re-encoded as one text), so each piece keeps its own tokens, the length of
the prompt is an exact sum, and the needles and the question survive decoding unchanged. A
context length ``L`` (tokens) holds the prompt and the answer budget: ``len(prompt) +
max_new_tokens == L``, as in RULER, where generation stays inside the length evaluated. A length
too short for a task is refused with :class:`LengthTooShort`, naming both numbers; nothing is
ever truncated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from lcx.data.tokenizers import Tokenizer
from lcx.evals.haystack import haystack_tokens

MIN_HAYSTACK = 16
"""Fewest haystack (or filler) tokens a prompt holds: a shorter one is refused, not built."""

ANSWER_SLACK = 8
"""Tokens of the answer budget beyond the longest answer's UTF-8 bytes (the budget: bytes + this;
a byte-level tokenizer, lcx's byte and BPE ones, spends at most one token per byte)."""


class LengthTooShort(ValueError):
    """A context length that cannot hold a task's prompt and answer budget.

    A ``ValueError`` (callers that refuse a grid see the same error as before); the evaluation
    report catches only this one to mark a (task, length) cell as not run
    (:func:`lcx.evals.runner.fit_grid`), never any other error.

    Attributes:
      task: the task's name; length: the length refused, in tokens.
      need: the least length, in tokens, that holds this example (None where it is not known:
        ``fwe``'s ranking that never came out without a tie).
    """

    def __init__(self, message: str, *, task: str, length: int, need: int | None):
        super().__init__(message)
        self.task, self.length, self.need = task, int(length), need


@dataclasses.dataclass(frozen=True)
class Example:
    """One prompt of a task and what scores its answer.

    Attributes:
      task: the task's name (:data:`lcx.evals.TASKS`).
      length: L, the context length in tokens: ``prompt.size + max_new_tokens``.
      depth: where the (first) needle sits, a fraction of the haystack in [0, 1]; None for a task
        that places nothing at a depth.
      prompt: int32 ``[L - max_new_tokens]`` token ids.
      answers: the reference strings the generated text is matched against.
      max_new_tokens: the answer budget, tokens to generate.
      metric: the scoring rule (:func:`lcx.evals.scoring.score`): ``all`` or ``part``.
    """

    task: str
    length: int
    depth: float | None
    prompt: np.ndarray
    answers: tuple[str, ...]
    max_new_tokens: int
    metric: str


@dataclasses.dataclass(frozen=True)
class Frame:
    """What a prompt of a task is built into: the tokenizer, the generator and the sizes.

    Attributes:
      task: the task's name, for messages.
      tokenizer: the run's tokenizer.
      rng: the example's generator.
      length: L, the context length in tokens; budget: the answer budget in tokens.
      split: whose material the example draws (:mod:`lcx.evals.splits`): ``eval`` or ``train``.
    """

    task: str
    tokenizer: Tokenizer
    rng: np.random.Generator
    length: int
    budget: int
    split: str = "eval"

    @property
    def prompt_tokens(self) -> int:
        """Tokens of the prompt: ``length - budget``."""
        return self.length - self.budget

    def encode(self, text: str) -> np.ndarray:
        """int32 ``[T]`` tokens of ``text`` (no BOS/EOS)."""
        return np.asarray(self.tokenizer.encode(text), np.int32)

    @property
    def bos(self) -> np.ndarray:
        """int32 ``[1]`` BOS where the tokenizer puts one before each document (as the model was
        trained: :meth:`lcx.data.tokenizers.Tokenizer.encode_documents`), else ``[0]``."""
        t = self.tokenizer
        return np.asarray([t.bos_id] if t.add_bos and t.bos_id is not None else [], np.int32)

    def filler_size(self, fixed: int) -> int:
        """Tokens left for the haystack once ``fixed`` tokens of template are placed.

        Raises:
          LengthTooShort: fewer than :data:`MIN_HAYSTACK` left; names the length, the minimum
            length and the tokenizer.
        """
        n = self.prompt_tokens - fixed
        if n < MIN_HAYSTACK:
            need = fixed + MIN_HAYSTACK + self.budget
            raise LengthTooShort(
                f"eval length {self.length} is too short for task {self.task}: its template, needles and "
                f"answer budget of {self.budget} tokens need at least {need} tokens of tokenizer "
                f"{self.tokenizer.name} (with {MIN_HAYSTACK} of haystack); use lengths >= {need}",
                task=self.task,
                length=self.length,
                need=need,
            )
        return n

    def with_haystack(self, head: str, needles: Sequence[tuple[float, str]], tail: str) -> np.ndarray:
        """(BOS,) ``head``, then real text with each needle at its depth, then ``tail``: exactly
        :attr:`prompt_tokens` tokens.

        Args:
          head: the instruction before the haystack.
          needles: ``(depth in [0, 1], text)``; each text goes on its own line at that fraction
            of the haystack (ties keep their order).
          tail: the question and the answer's start, after the haystack.

        Returns:
          int32 ``[prompt_tokens]``.

        Raises:
          LengthTooShort: the length cannot hold the pieces (:meth:`filler_size`).
        """
        h, t = np.concatenate([self.bos, self.encode(head)]), self.encode(tail)
        placed = sorted(((float(d), self.encode(f"\n{x}\n")) for d, x in needles), key=lambda p: p[0])
        n = self.filler_size(h.size + t.size + sum(x.size for _, x in placed))
        hay = haystack_tokens(self.tokenizer, n, self.rng, self.split)
        parts, at = [h], 0
        for d, x in placed:
            cut = int(round(d * n))
            parts += [hay[at:cut], x]
            at = cut
        parts += [hay[at:], t]
        return _join(parts, self.prompt_tokens)

    def with_list(self, head: str, items: Sequence[str], tail: str) -> np.ndarray:
        """(BOS,) real text, ``head``, the ``items`` in order, ``tail``: exactly :attr:`prompt_tokens`
        tokens (the real text takes what the items leave).

        Raises:
          LengthTooShort: the pieces leave fewer than :data:`MIN_HAYSTACK` tokens of real text.
        """
        h, t = self.encode(head), self.encode(tail)
        xs = [self.encode(x) for x in items]
        n = self.filler_size(self.bos.size + h.size + t.size + sum(x.size for x in xs))
        hay = haystack_tokens(self.tokenizer, n, self.rng, self.split)
        return _join([self.bos, hay, h, *xs, t], self.prompt_tokens)


def _join(parts: Sequence[np.ndarray], size: int) -> np.ndarray:
    out = np.concatenate(parts).astype(np.int32)
    assert out.size == size, (out.size, size)  # the sizes above are exact by construction
    return out


__all__ = ["ANSWER_SLACK", "MIN_HAYSTACK", "Example", "Frame", "LengthTooShort"]
