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
    """One row of ``seq_len`` tokens: ``example``'s prompt, :func:`answer_text` and the EOS (if the
    tokenizer has one), the loss on the answer and the EOS (weight 1) and on the prompt's own
    next tokens (weight ``prompt_loss``: 0, the answer alone; the loss is a weighted mean,
    :func:`lcx.training.loss.loss_sum_and_count`), then padding.

    Returns:
      the five :data:`lcx.data.BATCH_KEYS` arrays, each ``[seq_len]`` (int32; ``loss_mask`` float32).

    Raises:
      ValueError: the example's length is not ``seq_len``, or its answer does not fit its budget.
    """
    if example.length != seq_len:
        raise ValueError(f"example of length {example.length} in a row of {seq_len} tokens")
    answer = np.asarray(tokenizer.encode(answer_text(example)), np.int32)
    eos = [] if tokenizer.eos_id is None else [tokenizer.eos_id]
    doc = np.concatenate([example.prompt, answer, np.asarray(eos, np.int32)])
    if doc.size > seq_len + 1:
        raise ValueError(
            f"task {example.task}: answer {answer_text(example)!r} ({answer.size} tokens) overflows its "
            f"budget of {example.max_new_tokens} tokens"
        )
    n = doc.size - 1  # inputs of the document; the rest of the row is padding
    rows = {
        "tokens": np.zeros(seq_len, np.int32),
        "targets": np.zeros(seq_len, np.int32),
        "positions": np.concatenate([np.arange(n), np.arange(seq_len - n)]).astype(np.int32),
        "segment_ids": np.full(seq_len, PAD_SEGMENT, np.int32),
        "loss_mask": np.zeros(seq_len, np.float32),
    }
    rows["tokens"][:n], rows["targets"][:n], rows["segment_ids"][:n] = doc[:-1], doc[1:], 1
    rows["loss_mask"][: example.prompt.size - 1] = float(prompt_loss)
    rows["loss_mask"][example.prompt.size - 1 : n] = 1.0
    return rows


def corpus_row(tokenizer: Tokenizer, rng: np.random.Generator, seq_len: int) -> dict[str, np.ndarray]:
    """A window of ``seq_len + 1`` tokens of the ``train`` split's documents, loss on every token."""
    doc = haystack_tokens(tokenizer, seq_len + 1, rng, "train")
    return {
        "tokens": doc[:-1].copy(),
        "targets": doc[1:].copy(),
        "positions": np.arange(seq_len, dtype=np.int32),
        "segment_ids": np.ones(seq_len, np.int32),
        "loss_mask": np.ones(seq_len, np.float32),
    }


def check_tasks(
    tokenizer: Tokenizer, tasks: Sequence[str], seq_len: int, corpus_fraction: float, prompt_loss: float = 0.0
) -> None:
    """Refuse a task list or mix that cannot make rows of ``seq_len`` tokens, before anything compiles.

    Raises:
      ValueError: no task and ``corpus_fraction < 1``, an unknown task, ``corpus_fraction`` or
        ``prompt_loss`` outside [0, 1], or a task whose examples do not fit ``seq_len`` (names both numbers).
    """
    if not 0.0 <= corpus_fraction <= 1.0:
        raise ValueError(f"data.corpus_fraction={corpus_fraction} must lie in [0, 1] (the share of corpus rows)")
    if not 0.0 <= prompt_loss <= 1.0:
        raise ValueError(f"data.prompt_loss={prompt_loss} must lie in [0, 1] (the prompt tokens' loss weight)")
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

    def __post_init__(self) -> None:
        super().__post_init__()
        check_batch_args(self.seq_len, self.global_batch, self.layout, self.context_degree)

    def row(self, seed: int, index: int) -> dict[str, np.ndarray]:
        """Row ``index`` of the stream seeded ``seed`` (a pure function of both and ``seq_len``)."""
        rng = np.random.default_rng([int(seed), int(index), self.seq_len])
        if not self.tasks or rng.random() < self.corpus_fraction:
            return corpus_row(self.tokenizer, rng, self.seq_len)
        task = get_task(self.tasks[int(rng.integers(len(self.tasks)))])
        ex = task.example(
            self.tokenizer,
            seed=int(seed),
            length=self.seq_len,
            depth=float(rng.uniform()),
            index=int(index),
            split="train",
        )
        return example_row(self.tokenizer, ex, self.seq_len, self.prompt_loss)


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
    check_tasks(tok, tasks, spec.seq_len, float(data.corpus_fraction), float(data.prompt_loss))
    mix = {
        "tokenizer": tok,
        "tasks": tasks,
        "corpus_fraction": float(data.corpus_fraction),
        "prompt_loss": float(data.prompt_loss),
    }
    train = TaskBatches(**spec.rows(), **mix, seed=spec.seed)
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
    "tasks_data",
]
