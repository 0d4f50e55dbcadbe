"""The long-context tasks scored by generation, one registry line each (:data:`TASKS`).

The task set follows RULER (Hsieh et al. 2024, arXiv:2404.06654, section 3; github.com/NVIDIA/
RULER, ``scripts/data/synthetic/``): needle-in-a-haystack with one needle, with distractor keys
(multi-key), with several values for one key (multi-value) and with several keys asked at once
(multi-query); variable tracking (a chain of assignments to follow); common-words extraction
(the words that repeat most in a list) and frequent-words extraction (the most frequent words of
a Zipf-distributed text); plus the pass key of Mohtashami & Jaggi (2023). RULER's facts carry
over: 7-digit values, 4 needles for the multi-needle variants, 1 chain of 4 hops, 10 common words
30 times against 3 times, a Zipf exponent of 2 and the 3 most frequent words. The wording is
lcx's and the haystack is lcx's embedded real text (:mod:`lcx.evals.haystack`).

An example is a pure function of ``(task, seed, length, depth, index, split)`` and the tokenizer
(:meth:`Task.example`); its prompt has exactly ``length - max_new_tokens`` tokens
(:mod:`lcx.evals.prompt`). Its haystack, keys, values and names come from one split
(:mod:`lcx.evals.splits`): ``eval`` for scoring, ``train`` for the training rows of
``data=tasks``; no two examples of different splits share any of them. A new task is a final
subclass of :class:`Task` and one line in :data:`TASKS`.
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import string
import zlib
from typing import final

import numpy as np

from lcx.data.tokenizers import Tokenizer
from lcx.evals.haystack import WORD_LENGTHS, draw_words, word_pool
from lcx.evals.prompt import ANSWER_SLACK, MIN_HAYSTACK, Example, Frame, LengthTooShort
from lcx.evals.scoring import METRICS
from lcx.evals.splits import check_split, draw_in_split


class Task(abc.ABC):
    """A long-context task: builds prompts and names the rule that scores their answers.

    Attributes (of every final subclass):
      name: the registry name; metric: the scoring rule (``all`` / ``part``); uses_depth:
        whether the example places its needle at the depth asked for (else depth is None).
    """

    name: str
    metric: str = "all"
    uses_depth: bool = True

    @abc.abstractmethod
    def answer_bytes(self) -> int:
        """UTF-8 bytes of the longest answer an example can have (sizes the answer budget)."""

    @abc.abstractmethod
    def build(self, frame: Frame, depth: float) -> tuple[np.ndarray, tuple[str, ...]]:
        """``(prompt, answers)``: int32 ``[frame.prompt_tokens]`` tokens and the references."""

    @property
    def max_new_tokens(self) -> int:
        """The answer budget in tokens: :meth:`answer_bytes` + :data:`ANSWER_SLACK`."""
        return self.answer_bytes() + ANSWER_SLACK

    def example(
        self, tokenizer: Tokenizer, *, seed: int, length: int, depth: float, index: int, split: str = "eval"
    ) -> Example:
        """Example ``index`` of this task at ``(length, depth)``: a pure function of the
        arguments (the generator is seeded by all of them but the split, and the task's name).

        Args:
          tokenizer: the run's tokenizer; length: L, tokens of prompt plus answer budget.
          depth: the needle's place in the haystack, in [0, 1] (ignored, and recorded as None,
            by a task that does not use it); seed, index: which example.
          split: ``eval`` (scoring) or ``train`` (training rows): whose haystack documents, keys,
            values and names it draws (:mod:`lcx.evals.splits`).

        Raises:
          ValueError: ``depth`` outside [0, 1]; an unknown split.
          LengthTooShort: ``length`` too short for the task (a ``ValueError``; names both
            numbers).
        """
        if not 0.0 <= depth <= 1.0:
            raise ValueError(f"needle depth {depth} must lie in [0, 1] (a fraction of the haystack)")
        d = float(depth) if self.uses_depth else None
        code = -1 if d is None else int(round(d * 1_000_000))
        rng = np.random.default_rng([int(seed) % 2**32, zlib.crc32(self.name.encode()), int(length), code + 1, index])
        frame = Frame(self.name, tokenizer, rng, int(length), self.max_new_tokens, check_split(split))
        prompt, answers = self.build(frame, 0.5 if d is None else d)
        return Example(self.name, int(length), d, prompt, answers, self.max_new_tokens, self.metric)


def _numbers(rng: np.random.Generator, k: int, digits: int, split: str) -> list[str]:
    """``k`` distinct decimal numbers of exactly ``digits`` digits, of ``split``."""
    out: list[str] = []
    while len(out) < k:
        v = draw_in_split(rng, lambda r: str(int(r.integers(10 ** (digits - 1), 10**digits))), split)
        if v not in out:
            out.append(v)
    return out


NIAH_HEAD = (
    "Special magic numbers are hidden in the text below. Memorize them: you will be asked for them afterwards.\n"
)
NIAH_NEEDLE = "One of the special magic numbers for {key} is: {value}."
NIAH_QUESTION = (
    "\nWhat are all the special magic numbers for {keys} in the text above? "
    "The special magic numbers for {keys} in the text above are:"
)
PASSKEY_HEAD = "A pass key is hidden in the text below. Find it and memorize it.\n"
PASSKEY_NEEDLE = "The pass key is {value}. Remember it. {value} is the pass key."
PASSKEY_QUESTION = "\nWhat is the pass key? The pass key is"


@final
@dataclasses.dataclass(frozen=True)
class Needles(Task):
    """Needle-in-a-haystack: ``keys`` needles ``key -> value`` in real text; the first
    ``queries`` keys are asked for, each with ``values`` values; the first queried needle sits at
    the depth asked for, the others at depths drawn from the example's generator.

    Attributes:
      keys: keys with needles (queried and distractors); values: needles (values) per queried
        key; queries: keys asked for; digits: digits of a value.
      keyed: keys are two corpus words (``word-word``); False: one unnamed needle (pass key).
      head, needle, question: the template (``needle`` formats ``key`` and ``value``,
        ``question`` formats ``keys``).
    """

    name: str
    keys: int = 1
    values: int = 1
    queries: int = 1
    digits: int = 7
    keyed: bool = True
    head: str = NIAH_HEAD
    needle: str = NIAH_NEEDLE
    question: str = NIAH_QUESTION

    def __post_init__(self):
        if not 1 <= self.queries <= self.keys or self.values < 1 or self.digits < 1:
            raise ValueError(f"task {self.name}: need 1 <= queries <= keys, values >= 1, digits >= 1")
        if not self.keyed and self.keys != 1:
            raise ValueError(f"task {self.name}: an unkeyed needle task has one key, got keys={self.keys}")

    def answer_bytes(self) -> int:
        return self.queries * self.values * (self.digits + 2)

    def build(self, frame: Frame, depth: float) -> tuple[np.ndarray, tuple[str, ...]]:
        rng = frame.rng
        words = draw_words(rng, 2 * self.keys, frame.split) if self.keyed else ["", ""]
        keys = ["-".join(words[2 * i : 2 * i + 2]) for i in range(self.keys)]
        counts = [self.values if i < self.queries else 1 for i in range(self.keys)]
        values = _numbers(rng, sum(counts), self.digits, frame.split)
        pairs = [(k, values.pop(0)) for k, c in zip(keys, counts) for _ in range(c)]
        depths = [depth, *rng.uniform(0.0, 1.0, len(pairs) - 1)]
        needles = [(d, self.needle.format(key=k, value=v)) for d, (k, v) in zip(depths, pairs)]
        answers = tuple(v for k, v in pairs if k in keys[: self.queries])
        tail = self.question.format(keys=", ".join(keys[: self.queries]))
        return frame.with_haystack(self.head, needles, tail), answers


VT_HEAD = "Memorize the variable assignments hidden in the text below; you will be asked about them.\n"
VT_QUESTION = (
    "\nQuestion: which variables are assigned the value {value}, directly or through other variables? "
    "Answer: the variables assigned the value {value} are:"
)


@final
@dataclasses.dataclass(frozen=True)
class VariableTracking(Task):
    """Variable tracking: ``chains`` chains ``VAR A = 12345. VAR B = VAR A. ...`` of ``hops``
    hops each, their statements in order at depths drawn from the generator; the answer is every
    variable of the first chain (each a 5-letter upper-case name)."""

    name: str
    chains: int = 1
    hops: int = 4
    digits: int = 5
    uses_depth: bool = False

    def answer_bytes(self) -> int:
        return (self.hops + 1) * 7

    def build(self, frame: Frame, depth: float) -> tuple[np.ndarray, tuple[str, ...]]:
        rng = frame.rng
        names: list[str] = []
        while len(names) < self.chains * (self.hops + 1):
            n = draw_in_split(rng, lambda r: "".join(r.choice(list(string.ascii_uppercase), 5)), frame.split)
            if n not in names:
                names.append(n)
        values = _numbers(rng, self.chains, self.digits, frame.split)
        needles = []
        for c in range(self.chains):
            chain = names[c * (self.hops + 1) : (c + 1) * (self.hops + 1)]
            texts = [f"VAR {chain[0]} = {values[c]}."] + [f"VAR {b} = VAR {a}." for a, b in zip(chain, chain[1:])]
            needles += list(zip(np.sort(rng.uniform(0.0, 1.0, len(texts))), texts))
        answers = tuple(names[: self.hops + 1])
        return frame.with_haystack(VT_HEAD, needles, VT_QUESTION.format(value=values[0])), answers


CWE_HEAD = "\nBelow is a list of words. Memorize the ones that appear most often.\n"
CWE_QUESTION = (
    "\nQuestion: what are the {n} most common words in the list above? Answer: the {n} most common words are:"
)


@final
@dataclasses.dataclass(frozen=True)
class CommonWords(Task):
    """Common-words extraction: ``common`` corpus words ``freq_common`` times each among as many
    other words, ``freq_rare`` times each, as the length holds, shuffled; the answer is the
    common words."""

    name: str
    common: int = 10
    freq_common: int = 30
    freq_rare: int = 3
    uses_depth: bool = False

    def __post_init__(self):
        if not self.freq_common > self.freq_rare >= 1 or self.common < 1:
            raise ValueError(f"task {self.name}: need freq_common > freq_rare >= 1 and common >= 1")

    def answer_bytes(self) -> int:
        return self.common * (WORD_LENGTHS[1] + 2)

    def build(self, frame: Frame, depth: float) -> tuple[np.ndarray, tuple[str, ...]]:
        rng = frame.rng
        tail = CWE_QUESTION.format(n=self.common)
        pool = word_pool(frame.split)
        words = draw_words(
            rng, min(len(pool), self.common + max(0, frame.prompt_tokens) // self.freq_rare), frame.split
        )
        cost = {w: frame.encode(f" {w}").size for w in words}
        items = [w for w in words[: self.common] for _ in range(self.freq_common)]
        fixed = frame.bos.size + frame.encode(CWE_HEAD).size + frame.encode(tail).size
        room = frame.prompt_tokens - MIN_HAYSTACK - fixed
        used = sum(cost[w] for w in items)
        for w in words[self.common :] if used <= room else ():
            if used + self.freq_rare * cost[w] > room:
                break
            items += [w] * self.freq_rare
            used += self.freq_rare * cost[w]
        rng.shuffle(items)
        return frame.with_list(CWE_HEAD, [f" {w}" for w in items], tail), tuple(words[: self.common])


FWE_HEAD = "\nBelow is a text of coded words. Memorize which ones appear most often.\n"
FWE_QUESTION = (
    "\nQuestion: what are the {n} most frequent coded words in the text above? "
    "Answer: the {n} most frequent coded words are:"
)


@final
@dataclasses.dataclass(frozen=True)
class FrequentWords(Task):
    """Frequent-words extraction: coded words (random ``letters``-letter strings) drawn from a
    Zipf law of exponent ``alpha`` over a vocabulary of ``vocab`` words until the length is full;
    the answer is the ``top`` most frequent, redrawn until they are unambiguous (no tie)."""

    name: str
    alpha: float = 2.0
    top: int = 3
    vocab: int = 1000
    letters: int = 5
    uses_depth: bool = False

    def answer_bytes(self) -> int:
        return self.top * (self.letters + 2)

    def build(self, frame: Frame, depth: float) -> tuple[np.ndarray, tuple[str, ...]]:
        rng = frame.rng
        tail = FWE_QUESTION.format(n=self.top)
        fixed = frame.bos.size + frame.encode(FWE_HEAD).size + frame.encode(tail).size
        frame.filler_size(fixed)  # refuses a length with no room at all
        room = frame.prompt_tokens - MIN_HAYSTACK - fixed
        coded: dict[str, int] = {}
        while len(coded) < self.vocab:
            w = draw_in_split(rng, lambda r: "".join(r.choice(list(string.ascii_lowercase), self.letters)), frame.split)
            coded.setdefault(w, frame.encode(f" {w}").size)
        vocab = list(coded)
        for _ in range(100):
            items, used = [], 0
            for r in rng.zipf(self.alpha, size=max(room, 0)):
                w = vocab[(int(r) - 1) % self.vocab]
                if used + coded[w] > room:
                    break
                items.append(w)
                used += coded[w]
            ranked = collections.Counter(items).most_common(self.top + 1)
            if len(ranked) > self.top and ranked[self.top - 1][1] > ranked[self.top][1]:
                answers = tuple(w for w, _ in ranked[: self.top])
                return frame.with_list(FWE_HEAD, [f" {w}" for w in items], tail), answers
        raise LengthTooShort(
            f"eval length {frame.length} is too short for task {self.name}: 100 draws of its "
            f"{frame.prompt_tokens}-token text never ranked {self.top} words without a tie; use a longer length",
            task=self.name,
            length=frame.length,
            need=None,
        )


TASKS: dict[str, Task] = {
    "passkey": Needles(
        "passkey", digits=5, keyed=False, head=PASSKEY_HEAD, needle=PASSKEY_NEEDLE, question=PASSKEY_QUESTION
    ),
    "niah_single": Needles("niah_single"),
    "niah_multikey": Needles("niah_multikey", keys=4),
    "niah_multivalue": Needles("niah_multivalue", values=4),
    "niah_multiquery": Needles("niah_multiquery", keys=4, queries=4),
    "vt": VariableTracking("vt"),
    "cwe": CommonWords("cwe"),
    "fwe": FrequentWords("fwe"),
}
"""Every task by name; ``eval.tasks`` names a subset."""

assert all(t.metric in METRICS and t.name == k for k, t in TASKS.items())


def get_task(name: str) -> Task:
    """The task ``name`` of :data:`TASKS`.

    Raises:
      ValueError: an unknown name (lists the valid ones).
    """
    if name not in TASKS:
        raise ValueError(f"unknown eval task {name!r}; use some of {', '.join(TASKS)}")
    return TASKS[name]


__all__ = ["TASKS", "CommonWords", "FrequentWords", "Needles", "Task", "VariableTracking", "get_task"]
