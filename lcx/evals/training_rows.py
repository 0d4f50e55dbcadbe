"""``data=tasks``: training rows in the long-context tasks' own formats, mixed with real text.

A model learns to retrieve by generation when it is trained on prompts like the ones it is scored
on, followed by their answers: each row here is, with probability ``corpus_fraction``, a window of
the embedded corpus (language-modelling loss on every token), else one example of a task of
:data:`lcx.evals.TASKS` built at the row's length (:meth:`lcx.evals.tasks.Task.example`), its
needle at a depth uniform in [0, 1], followed by the answer (:func:`answer_text`) and the
tokenizer's EOS, with the loss on the answer and the EOS (and, with weight ``prompt_loss``, on
the prompt's own tokens: the repeats inside a prompt, a key asked for in the question or a pass
key said twice, are copies that teach the induction the answer needs). What follows the EOS is padding
(segment id -1, no loss). The examples come from the ``train`` split (:mod:`lcx.evals.splits`):
training documents, keys, values and names that no evaluation example ever holds, and seeds
offset by :data:`TRAIN_SEED_OFFSET`, so a score of a model trained on these rows is a held-out
score. The same holds for the fixed validation rows (``train`` split, their own seeds).

Rows are a pure function of ``(seed, row index, seq_len)``: the stream's position (the row
counter) is its whole state, as for :class:`lcx.data.passkey.PasskeyBatches`, and a later
stage at another ``seq_len`` (:mod:`lcx.training.schedule`) continues at the next row.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lcx.data.packing import PAD_SEGMENT
from lcx.data.pipeline import check_batch_args
from lcx.data.stream import Batch, BatchSpec, Data, FixedRows, RowCursor, Rows, stack_rows
from lcx.data.tokenizers import Tokenizer, data_tokenizer
from lcx.evals.haystack import haystack_tokens
from lcx.evals.prompt import Example, LengthTooShort
from lcx.evals.tasks import get_task

log = logging.getLogger(__name__)

TRAIN_SEED_OFFSET = 1 << 20
"""Added to ``train.seed`` for the training examples' seeds (evaluation seeds are small)."""

VAL_SEED_OFFSET = 1 << 21
"""Added to ``data.split_seed`` for the validation rows' seeds."""


def answer_text(example: Example) -> str:
    """What the model is trained to say after a prompt: the references in order, comma-separated,
    after a space, ending with a period (``" 1234567."``, ``" QWERT, ABCDE, ..."``)."""
    return " " + ", ".join(example.answers) + "."


def example_row(
    tokenizer: Tokenizer, example: Example, seq_len: int, prompt_loss: float = 0.0
) -> dict[str, np.ndarray]:
    """One row of ``seq_len`` tokens holding one example of length ``seq_len``:
    :func:`packed_row` of ``[example]``.

    Raises:
      ValueError: the example's length is not ``seq_len``, or its answer does not fit its budget.
    """
    if example.length != seq_len:
        raise ValueError(f"example of length {example.length} in a row of {seq_len} tokens")
    return packed_row(tokenizer, [example], seq_len, prompt_loss)


def _document(tokenizer: Tokenizer, example: Example) -> np.ndarray:
    """int32 ``[T]``: ``example``'s prompt, :func:`answer_text` and the EOS (if the tokenizer has one).

    Raises:
      ValueError: the answer overflows the example's budget (``T > example.length + 1``).
    """
    answer = np.asarray(tokenizer.encode(answer_text(example)), np.int32)
    eos = [] if tokenizer.eos_id is None else [tokenizer.eos_id]
    doc = np.concatenate([example.prompt, answer, np.asarray(eos, np.int32)])
    if doc.size > example.length + 1:
        raise ValueError(
            f"task {example.task}: answer {answer_text(example)!r} ({answer.size} tokens) overflows its "
            f"budget of {example.max_new_tokens} tokens"
        )
    return doc


def packed_row(
    tokenizer: Tokenizer, examples: Sequence[Example], seq_len: int, prompt_loss: float = 0.0
) -> dict[str, np.ndarray]:
    """One row of ``seq_len`` tokens: the examples one after another, each its own document
    (segment ids 1, 2, ...; positions restart at 0), each its prompt, :func:`answer_text` and the
    EOS, the loss on the answer and the EOS (weight 1) and on the prompt's own next tokens
    (weight ``prompt_loss``: 0, the answer alone; the loss is a weighted mean,
    :func:`lcx.training.loss.loss_sum_and_count`), then padding (segment id -1, no loss).

    Returns:
      the five :data:`lcx.data.BATCH_KEYS` arrays, each ``[seq_len]`` (int32; ``loss_mask`` float32).

    Raises:
      ValueError: the examples' lengths sum past ``seq_len``, or an answer does not fit its budget.
    """
    if sum(ex.length for ex in examples) > seq_len:
        lengths = [ex.length for ex in examples]
        raise ValueError(f"examples of lengths {lengths} (sum {sum(lengths)}) overflow a row of {seq_len} tokens")
    rows = {
        "tokens": np.zeros(seq_len, np.int32),
        "targets": np.zeros(seq_len, np.int32),
        "positions": np.zeros(seq_len, np.int32),
        "segment_ids": np.full(seq_len, PAD_SEGMENT, np.int32),
        "loss_mask": np.zeros(seq_len, np.float32),
    }
    at = 0
    for seg, ex in enumerate(examples, start=1):
        doc = _document(tokenizer, ex)
        n = doc.size - 1  # inputs of the document
        s = slice(at, at + n)
        rows["tokens"][s], rows["targets"][s], rows["segment_ids"][s] = doc[:-1], doc[1:], seg
        rows["positions"][s] = np.arange(n)
        rows["loss_mask"][at : at + ex.prompt.size - 1] = float(prompt_loss)
        rows["loss_mask"][at + ex.prompt.size - 1 : at + n] = 1.0
        at += n
    rows["positions"][at:] = np.arange(seq_len - at)
    return rows


def corpus_row(tokenizer: Tokenizer, rng: np.random.Generator, seq_len: int) -> dict[str, np.ndarray]:
    """A window of ``seq_len + 1`` tokens of the ``train`` split's documents, loss on every token."""
    return _window_row(haystack_tokens(tokenizer, seq_len + 1, rng, "train"), np.ones(seq_len, np.float32))


def _window_row(doc: np.ndarray, loss_mask: np.ndarray) -> dict[str, np.ndarray]:
    """The row of one document ``doc`` of ``seq_len + 1`` tokens that fills it, with ``loss_mask``."""
    n = doc.size - 1
    return {
        "tokens": doc[:-1].copy(),
        "targets": doc[1:].copy(),
        "positions": np.arange(n, dtype=np.int32),
        "segment_ids": np.ones(n, np.int32),
        "loss_mask": loss_mask,
    }


REPEAT_SPAN = (8, 48)
"""Lengths, in tokens, of the spans a :func:`repeat_row` writes twice (uniform, inclusive)."""


def repeat_row(tokenizer: Tokenizer, rng: np.random.Generator, seq_len: int) -> dict[str, np.ndarray]:
    """A window of the ``train`` split's documents in which spans are written a second time
    further on, the loss on each repeat's tokens after its first (weight 1) and nowhere else: the
    copy an induction head makes (Olsson et al. 2022, "In-context learning and induction heads",
    arXiv:2209.11895, measure induction heads on repeated random tokens), trained directly,
    at distances from a few tokens to the whole row.

    Spans of :data:`REPEAT_SPAN` tokens are drawn one after another: a span ``[i, i + k)`` and a
    later place ``j >= i + k`` for its copy, while the row has room.

    Returns:
      the five :data:`lcx.data.BATCH_KEYS` arrays, each ``[seq_len]`` (one document, segment id 1).
    """
    doc = haystack_tokens(tokenizer, seq_len + 1, rng, "train").copy()
    mask = np.zeros(seq_len, np.float32)
    lo, hi = REPEAT_SPAN
    at = 0
    while at + 2 * lo <= seq_len:
        k = int(rng.integers(lo, min(hi, (seq_len - at) // 2) + 1))
        i = at + int(rng.integers(0, (seq_len - at - 2 * k) // 2 + 1))
        j = int(rng.integers(i + k, seq_len - k + 1))
        doc[j : j + k] = doc[i : i + k]
        mask[j : j + k - 1] = 1.0  # targets doc[j + 1 : j + k]: the repeat after its first token
        at = j + k
    return _window_row(doc, mask)


def check_tasks(
    tokenizer: Tokenizer,
    tasks: Sequence[str],
    seq_len: int,
    corpus_fraction: float,
    prompt_loss: float = 0.0,
    min_length: int | None = None,
    repeat_fraction: float = 0.0,
) -> None:
    """Refuse a task list or mix that cannot make rows of ``seq_len`` tokens, before anything compiles.

    Raises:
      ValueError: no task and ``corpus_fraction < 1``, an unknown task, ``corpus_fraction`` or
        ``prompt_loss`` outside [0, 1], ``repeat_fraction`` outside [0, 1 - ``corpus_fraction``], ``min_length`` outside [1, ``seq_len``], or a task whose examples do not fit ``seq_len`` (names both numbers).
    """
    if not 0.0 <= corpus_fraction <= 1.0:
        raise ValueError(f"data.corpus_fraction={corpus_fraction} must lie in [0, 1] (the share of corpus rows)")
    if not 0.0 <= prompt_loss <= 1.0:
        raise ValueError(f"data.prompt_loss={prompt_loss} must lie in [0, 1] (the prompt tokens' loss weight)")
    if not 0.0 <= repeat_fraction <= 1.0 - corpus_fraction:
        raise ValueError(
            f"data.repeat_fraction={repeat_fraction} must lie in [0, 1 - data.corpus_fraction="
            f"{1.0 - corpus_fraction:g}] (the share of repeat rows; the rest are task rows)"
        )
    if min_length is not None and not 1 <= int(min_length) <= seq_len:
        raise ValueError(
            f"data.min_length={min_length} must lie in [1, train.seq_len={seq_len}] "
            "(null: one example of train.seq_len tokens per row)"
        )
    if not tasks and corpus_fraction < 1.0:
        raise ValueError("data.tasks is empty: name some of lcx.evals.TASKS, or set data.corpus_fraction=1")
    for name in tasks:
        task = get_task(name)
        try:
            for i in range(4):  # prompts vary in length with their draws: try a few
                example_row(
                    tokenizer,
                    task.example(tokenizer, seed=0, length=seq_len, depth=0.5, index=i, split="train"),
                    seq_len,
                )
        except LengthTooShort as e:
            raise ValueError(f"data.tasks: {e} (train.seq_len={seq_len})") from e


@dataclasses.dataclass(eq=False, kw_only=True)
class _TaskRows(Rows):
    """The row recipe shared by the training stream and the validation set."""

    tokenizer: Tokenizer
    tasks: tuple[str, ...]
    corpus_fraction: float
    prompt_loss: float = 0.0
    min_length: int | None = None
    repeat_fraction: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_batch_args(self.seq_len, self.global_batch, self.layout, self.context_degree)

    def row(self, seed: int, index: int) -> dict[str, np.ndarray]:
        """Row ``index`` of the stream seeded ``seed`` (a pure function of both and ``seq_len``):
        a corpus window, a :func:`repeat_row` (share ``repeat_fraction``), one example of
        ``seq_len`` tokens, or (``min_length`` set) examples of
        lengths drawn uniformly from ``[min_length, room left]`` packed while one fits."""
        rng = np.random.default_rng([int(seed), int(index), self.seq_len])
        draw = rng.random()
        if not self.tasks or draw < self.corpus_fraction:
            return corpus_row(self.tokenizer, rng, self.seq_len)
        if draw < self.corpus_fraction + self.repeat_fraction:
            return repeat_row(self.tokenizer, rng, self.seq_len)
        if self.min_length is None or self.min_length >= self.seq_len:
            ex = self._example(rng, seed, index, self.seq_len, self.seq_len)
            assert ex is not None  # a row's first example always exists (room == seq_len)
            return packed_row(self.tokenizer, [ex], self.seq_len, self.prompt_loss)
        examples: list[Example] = []
        room, lo = self.seq_len, int(self.min_length)
        while room >= lo:
            length = int(rng.integers(lo, room + 1))
            ex = self._example(rng, seed, index * self.seq_len + len(examples), length, room)
            if ex is None:
                break
            examples.append(ex)
            room -= ex.length
        return packed_row(self.tokenizer, examples, self.seq_len, self.prompt_loss)

    def _example(self, rng: np.random.Generator, seed: int, index: int, length: int, room: int) -> Example | None:
        """An example of a random task at ``length`` tokens, or at the task's own least length where
        that is longer (at most ``room``); None where none fits ``room`` (the row ends there).

        Raises:
          LengthTooShort: a row's first example (``room == seq_len``) fits not even ``seq_len``.
        """
        task = get_task(self.tasks[int(rng.integers(len(self.tasks)))])
        depth = float(rng.uniform())
        kw = {"seed": int(seed), "depth": depth, "index": int(index), "split": "train"}
        while True:  # the length grows to the task's least (it moves a little with the draws), at most to room
            try:
                return task.example(self.tokenizer, length=length, **kw)
            except LengthTooShort as e:
                if length == room:
                    if room == self.seq_len:  # a row's first example: at the row's length (check_tasks)
                        raise
                    return None
                length = min(room, max(length + 1, e.need or room))


@dataclasses.dataclass(eq=False, kw_only=True)
class TaskBatches(_TaskRows, RowCursor):
    """Infinite, deterministic, resumable training batches of :func:`example_row` /
    :func:`corpus_row` rows; row ``r`` is ``row(seed + TRAIN_SEED_OFFSET, r)``. Same interface as
    :class:`lcx.data.passkey.PasskeyBatches` (nominal epoch of 2**31 rows).

    Yields:
      dicts of the five :data:`BATCH_KEYS`, each ``[global_batch, seq_len]``, in ``layout``.
    """

    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        self._row = 0

    @property
    def rows_per_epoch(self) -> int:
        """Nominal (2**31): the stream never repeats."""
        return 2**31

    def __next__(self) -> Batch:
        rows = [self.row(self.seed + TRAIN_SEED_OFFSET, self._row + i) for i in range(self.global_batch)]
        self._row += self.global_batch
        return self.lay_out(stack_rows(rows))

    def state(self) -> dict[str, Any]:
        """The position (``epoch``, ``row``) and the stream's identity (``seed``, ``seq_len``, ``tasks``)."""
        epoch, row = divmod(self._row, self.rows_per_epoch)
        return {"epoch": epoch, "row": row, "seed": self.seed, "seq_len": self.seq_len, "tasks": ",".join(self.tasks)}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Resume at ``state`` (:meth:`state`).

        Raises:
          ValueError: ``state`` comes from another stream (names the field).
        """
        mine = self.state()
        for k in ("seed", "seq_len", "tasks"):
            if k in state and str(state[k]) != str(mine[k]):
                raise ValueError(f"data state mismatch: checkpoint has {k}={state[k]}, this run has {k}={mine[k]}")
        self._row = int(state["epoch"]) * self.rows_per_epoch + int(state["row"])

    def resume(self, state: Mapping[str, Any]) -> None:
        """:meth:`restore`; a ``state`` of another ``seq_len`` (an earlier stage) continues at the next row."""
        if "seq_len" in state and int(state["seq_len"]) != self.seq_len:
            log.info(
                "sequence length %s -> %d: task rows continue at row %s",
                state["seq_len"],
                self.seq_len,
                state.get("row"),
            )
            state = {**state, "seq_len": self.seq_len}
        self.restore(state)


@dataclasses.dataclass(eq=False, kw_only=True)
class TaskEval(_TaskRows, FixedRows):
    """A fixed validation set of ``rows`` rows, ``row(split_seed + VAL_SEED_OFFSET, i)``, in
    batches of ``global_batch`` (the last one padded with loss-free copies)."""

    rows: int = 32
    split_seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        self._rows = [self.row(self.split_seed + VAL_SEED_OFFSET, i) for i in range(int(self.rows))]

    def fixed_rows(self) -> list[dict[str, np.ndarray]]:
        """The validation rows."""
        return self._rows

    def unigram_entropy(self) -> float:
        """Entropy of the validation rows' scored targets, nats (the loss of a unigram guess)."""
        t = np.concatenate([r["targets"][r["loss_mask"] > 0] for r in self._rows])
        p = np.bincount(t) / t.size
        return float(-(p[p > 0] * np.log(p[p > 0])).sum())


def tasks_data(data: Any, spec: BatchSpec) -> Data:
    """The ``data=tasks`` source (:data:`lcx.data.sources.SOURCES`), as
    :class:`lcx.data.config.TasksData` configures it.

    Raises:
      ValueError: what :func:`check_tasks` refuses, bad sizes or layout.
    """
    tok = data_tokenizer(data)
    tasks = tuple(str(t) for t in data.tasks)
    min_length = None if data.min_length is None else int(data.min_length)
    repeats = float(data.repeat_fraction)
    check_tasks(tok, tasks, spec.seq_len, float(data.corpus_fraction), float(data.prompt_loss), min_length, repeats)
    mix = {
        "tokenizer": tok,
        "tasks": tasks,
        "corpus_fraction": float(data.corpus_fraction),
        "prompt_loss": float(data.prompt_loss),
    }
    train = TaskBatches(**spec.rows(), **mix, min_length=min_length, repeat_fraction=repeats, seed=spec.seed)
    val = TaskEval(**spec.rows(val=True), **mix, rows=int(data.eval_rows), split_seed=int(data.split_seed))
    return Data(train, val, tok)


__all__ = [
    "TRAIN_SEED_OFFSET",
    "VAL_SEED_OFFSET",
    "TaskBatches",
    "TaskEval",
    "answer_text",
    "check_tasks",
    "corpus_row",
    "example_row",
    "packed_row",
    "repeat_row",
    "tasks_data",
]
