"""Passkey retrieval: a synthetic long-context task (Mohtashami & Jaggi 2023, "Landmark Attention",
arXiv:2305.16300, section 4.2; used since by LongLoRA, YaRN and others).

Each row is one document of exactly ``seq_len + 1`` bytes: repeated filler sentences (no digits,
no ``<``), an intro, the key sentence ``The pass key is <12345>. Remember it. <12345> is the pass
key.`` (the Landmark-attention wording, with a ``<`` marker) at a controllable *depth* inside the
filler, and the question ``What is the pass key? The pass key is <12345>`` at the very end. Only
the answer digits carry loss (``loss_mask`` is 1.0 on the ``digits`` targets that spell the
answer, 0.0 elsewhere), so the loss measures retrieval alone; ``recall_loss=True`` adds the key's
repeat inside the key sentence (a short-range copy) for training.

The filler holds no digit and no ``<``: the task is solvable by an induction head (find the
earlier ``<``, copy what follows; then find the digit just produced, copy its successor), which
a 2-layer model can represent, yet the answer is up to ``seq_len`` tokens away from its key.

Depth ``d`` in ``[0, 1]``: the fraction of the filler placed before the key sentence (0: the key
right after the intro, far from the question; 1: just before the question).

Rows are a pure function of ``(seed, row index)``: the stream is deterministic and its position
(the row counter) is the whole state, as for :class:`lcx.data.Batches`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from lcx.data.config import PasskeyData
from lcx.data.stream import Batch, BatchSpec, Data, FixedRows, RowCursor, Rows, stack_rows
from lcx.data.tokenizers import ByteTokenizer
from lcx.sharding.layout import check_layout

log = logging.getLogger(__name__)

INTRO = "There is important info hidden inside a lot of irrelevant text. Find it and memorize it. "
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
KEY = "The pass key is <{key}>. Remember it. <{key}> is the pass key. "
QUESTION = "What is the pass key? The pass key is <"
END = ">"

# Seeds of the evaluation stream are offset so they never coincide with a training stream's.
_EVAL_SEED_OFFSET = 1_000_003


class PasskeyExample(NamedTuple):
    """One row of the task, in the original (un-laid-out) order.

    Attributes:
      arrays: the five :data:`lcx.data.BATCH_KEYS` arrays, each ``[S]`` (int32; ``loss_mask``
        float32).
      passkey: the answer, as a string of ``digits`` decimal digits.
      depth: requested depth in [0, 1].
      key_pos: index (token) of the first key digit in ``tokens``.
      answer_pos: int64 ``[digits]``, the token indices whose *targets* are the answer digits.
    """

    arrays: dict[str, np.ndarray]
    passkey: str
    depth: float
    key_pos: int
    answer_pos: np.ndarray


def min_seq_len(digits: int = 5) -> int:
    """Shortest ``seq_len`` (tokens) that holds the intro, key sentence and question."""
    return len(INTRO) + len(KEY.format(key="0" * digits)) + len(QUESTION) + digits + len(END) - 1


def repeats_filler(n: int, seed: int) -> str:
    """``n`` characters of random lowercase words, each sentence written twice in a row
    (``"qaz wex rop. qaz wex rop. "``): every second sentence can be copied from the one before,
    a dense version of the copy the answer needs (induction heads form on such repeats; Olsson
    et al. 2022, arXiv:2209.11895). No digits, no ``<``."""
    rng = np.random.default_rng([7919, int(seed)])
    parts, size = [], 0
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    while size < n:
        words = ["".join(rng.choice(letters, size=int(rng.integers(2, 7)))) for _ in range(int(rng.integers(2, 6)))]
        sent = " ".join(words).capitalize() + ". "
        parts.append(sent + sent)
        size += 2 * len(sent)
    return "".join(parts)[:n]


def passkey_example(
    seq_len: int,
    passkey: str,
    depth: float,
    filler_offset: int = 0,
    *,
    recall_loss: bool = False,
    filler: str = "sentences",
    loss_on: str = "answer",
) -> PasskeyExample:
    """Build one row of ``seq_len`` tokens whose answer is ``passkey`` placed at ``depth``.

    Args:
      seq_len: S, tokens per row (the document is S + 1 bytes: S inputs, S targets).
      passkey: the decimal digits to hide and ask for.
      depth: fraction of the filler before the key sentence, in [0, 1].
      filler_offset: where in the repeated filler sentences the filler starts (characters).
      recall_loss: also put loss on the key's repetition inside the key sentence (``<12345> is
        the pass key``): a short-range copy that teaches the tiny model the induction mechanism
        the long-range answer needs. Evaluation always scores the answer digits alone.
      filler: ``"sentences"`` (the classic repeated grass/sky/sun sentences, from
        ``filler_offset``) or ``"repeats"`` (:func:`repeats_filler` seeded by ``filler_offset``).
      loss_on: ``"answer"`` (the answer digits, plus the key's repeat with ``recall_loss``) or
        ``"all"`` (every token: a language-modelling loss over the whole row).

    Returns:
      :class:`PasskeyExample`.

    Raises:
      ValueError: ``passkey`` is not all digits; ``depth`` outside [0, 1]; ``seq_len`` shorter
        than :func:`min_seq_len`.
    """
    if not passkey.isdigit() or not passkey.isascii():
        raise ValueError(f"passkey must be decimal digits, got {passkey!r}")
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"passkey depth must lie in [0, 1], got {depth}")
    digits = len(passkey)
    if seq_len < min_seq_len(digits):
        raise ValueError(
            f"train.seq_len={seq_len} is too short for the passkey task with {digits} digits; "
            f"use at least {min_seq_len(digits)} tokens"
        )
    key = KEY.format(key=passkey)
    n_filler = seq_len + 1 - len(INTRO) - len(key) - len(QUESTION) - digits - len(END)
    if filler == "sentences":
        reps = -(-(n_filler + filler_offset) // len(FILLER)) + 1
        fill = (FILLER * reps)[filler_offset % len(FILLER) :][:n_filler]
    elif filler == "repeats":
        fill = repeats_filler(n_filler, filler_offset)
    else:
        raise ValueError(f"data.filler must be 'sentences' or 'repeats', got {filler!r}")
    if loss_on not in ("answer", "all"):
        raise ValueError(f"data.loss_on must be 'answer' or 'all', got {loss_on!r}")
    cut = int(round(depth * n_filler))
    head = INTRO + fill[:cut]
    text = head + key + fill[cut:] + QUESTION + passkey + END
    doc = np.frombuffer(text.encode("ascii"), dtype=np.uint8).astype(np.int32)
    assert doc.size == seq_len + 1, (doc.size, seq_len)
    tokens, targets = doc[:-1], doc[1:]
    # targets index t holds doc[t + 1]: the answer digits are doc[S - digits .. S - 1]
    first = seq_len + 1 - len(END) - digits  # doc index of the first answer digit
    answer_pos = np.arange(first - 1, first - 1 + digits, dtype=np.int64)
    loss_mask = np.zeros(seq_len, np.float32)
    loss_mask[answer_pos] = 1.0
    if loss_on == "all":
        loss_mask[:] = 1.0
    if recall_loss:
        second = len(head) + key.index("<", key.index("<") + 1) + 1  # doc index of the repeated key
        loss_mask[second - 1 : second - 1 + digits] = 1.0
    arrays = {
        "tokens": tokens.copy(),
        "targets": targets.copy(),
        "positions": np.arange(seq_len, dtype=np.int32),
        "segment_ids": np.ones(seq_len, np.int32),
        "loss_mask": loss_mask,
    }
    key_pos = len(head) + key.index("<") + 1
    return PasskeyExample(arrays, passkey, float(depth), key_pos, answer_pos)


def _draw(rng: np.random.Generator, digits: int) -> str:
    return "".join(str(d) for d in rng.integers(0, 10, size=digits))


class PasskeyBatches(Rows, RowCursor):
    """Infinite, deterministic, resumable training batches of passkey rows.

    Row ``r`` draws its passkey, depth (uniform in ``[min_depth, max_depth]``) and filler offset
    from ``np.random.default_rng([seed, r])``. Same interface as :class:`lcx.data.Batches`
    (``state``/``restore``/``skip``, ``rows_per_epoch``, ``global_batch``); the "epoch" is
    nominal (``rows_per_epoch`` = 2**31) because the stream never repeats.

    ``seq_len``, ``global_batch``, ``layout``, ``context_degree`` and ``seed`` are as for
    :class:`lcx.data.Batches`; ``recall_loss``, ``filler`` and ``loss_on`` as for
    :func:`passkey_example`. Training depths are uniform in ``[min_depth, max_depth]``, within
    [0, 1].

    Args:
      digits: passkey length in decimal digits.
      state: optional :meth:`state` dict to resume from.
      rows: :class:`lcx.data.stream.Rows`' fields (``seq_len``, ``global_batch``, ``layout``,
        ``context_degree``, ``layout_block``).

    Yields:
      dicts of the five :data:`BATCH_KEYS`, each ``[global_batch, seq_len]``, in ``layout``.

    Raises:
      ValueError: bad sizes, layout or depth range; ``seq_len`` below :func:`min_seq_len`.
    """

    def __init__(
        self,
        *,
        seed: int = 0,
        digits: int = 5,
        min_depth: float = 0.0,
        max_depth: float = 1.0,
        recall_loss: bool = False,
        filler: str = "sentences",
        loss_on: str = "answer",
        state: Mapping[str, int] | None = None,
        **rows: Any,
    ):
        super().__init__(**rows)  # seq_len, global_batch, layout, context_degree, layout_block: Rows'
        check_layout(self.layout, self.seq_len, self.context_degree)
        if self.global_batch < 1:
            raise ValueError(f"global batch must be >= 1 rows, got {self.global_batch}")
        if not 0.0 <= min_depth <= max_depth <= 1.0:
            raise ValueError(f"need 0 <= data.min_depth <= data.max_depth <= 1, got {min_depth}, {max_depth}")
        if digits < 1:
            raise ValueError(f"data.digits must be >= 1, got {digits}")
        if self.seq_len < min_seq_len(digits):
            raise ValueError(
                f"train.seq_len={self.seq_len} is too short for the passkey task; use >= {min_seq_len(digits)}"
            )
        self.seed, self.digits = int(seed), int(digits)
        self.min_depth, self.max_depth = float(min_depth), float(max_depth)
        self.recall_loss = bool(recall_loss)
        self.filler, self.loss_on = str(filler), str(loss_on)
        self._row = 0
        if state is not None:
            self.restore(state)

    @property
    def rows_per_epoch(self) -> int:
        """Nominal (2**31): the stream never repeats, so the "epoch" only splits the position."""
        return 2**31

    def example(self, row: int) -> PasskeyExample:
        """Row ``row`` of the stream (original order)."""
        rng = np.random.default_rng([self.seed, int(row)])
        key = _draw(rng, self.digits)
        depth = float(rng.uniform(self.min_depth, self.max_depth))
        offset = int(rng.integers(0, len(FILLER) if self.filler == "sentences" else 2**31))
        return passkey_example(
            self.seq_len, key, depth, offset, recall_loss=self.recall_loss, filler=self.filler, loss_on=self.loss_on
        )

    def __next__(self) -> Batch:
        ex = [self.example(self._row + i) for i in range(self.global_batch)]
        self._row += self.global_batch
        return self.lay_out(stack_rows([e.arrays for e in ex]))

    def state(self) -> dict[str, int]:
        """The stream position (``epoch``, ``row``) and its identity (``seed``, ``seq_len``, ``digits``)."""
        epoch, row = divmod(self._row, self.rows_per_epoch)
        return {"epoch": epoch, "row": row, "seed": self.seed, "seq_len": self.seq_len, "digits": self.digits}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Resume at ``state`` (from :meth:`state`).

        Raises:
          ValueError: ``state`` comes from a different stream (names the field).
        """
        mine = self.state()
        for k in ("seed", "seq_len", "digits"):
            if k in state and int(state[k]) != mine[k]:
                raise ValueError(f"data state mismatch: checkpoint has {k}={state[k]}, this run has {k}={mine[k]}")
        self._row = int(state["epoch"]) * self.rows_per_epoch + int(state["row"])

    def resume(self, state: Mapping[str, Any]) -> None:
        """:meth:`restore`; a ``state`` written at another ``seq_len`` continues at the next row
        (rows are drawn from ``(seed, row index)`` at whatever length the stage asks for)."""
        old_len = state.get("seq_len")
        if old_len is not None and int(old_len) != self.seq_len:
            log.info(
                "sequence length %s -> %d: generated data continues at row %s", old_len, self.seq_len, state.get("row")
            )
            state = {**state, "seq_len": self.seq_len}
        self.restore(state)


@dataclasses.dataclass(eq=False)
class PasskeyEval(FixedRows):
    """A fixed evaluation set: ``per_depth`` rows at each depth of ``depths``, depth-major.

    Rows are drawn from a stream independent of every training seed. ``examples`` lists them
    (original order, with depth, passkey and answer positions) for accuracy-by-depth evaluation;
    indexing gives laid-out batches of ``global_batch`` rows (the last one padded with copies of
    the last row whose loss mask is zeroed).

    ``seq_len``, ``global_batch``, ``layout``, ``context_degree`` and ``digits`` are as for
    :class:`PasskeyBatches`.

    Args:
      depths: depths in [0, 1] to evaluate.
      per_depth: rows per depth.
      seed: evaluation seed (``data.split_seed``).
      filler: as in training (:func:`passkey_example`); the loss is always on the answer only.
    """

    digits: int = 5
    depths: Sequence[float] = tuple(np.linspace(0, 1, 11))
    per_depth: int = 8
    seed: int = 0
    filler: str = "sentences"
    examples: list[PasskeyExample] = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        check_layout(self.layout, self.seq_len, self.context_degree)
        super().__post_init__()
        self.examples = []
        for i, d in enumerate(self.depths):
            for j in range(int(self.per_depth)):
                rng = np.random.default_rng([_EVAL_SEED_OFFSET + int(self.seed), i, j])
                key = _draw(rng, self.digits)
                offset = int(rng.integers(0, len(FILLER) if self.filler == "sentences" else 2**31))
                self.examples.append(passkey_example(self.seq_len, key, float(d), offset, filler=self.filler))

    def fixed_rows(self) -> list[dict[str, np.ndarray]]:
        """The rows of :attr:`examples`."""
        return [e.arrays for e in self.examples]

    def unigram_entropy(self) -> float:
        """Entropy of a uniform decimal digit, nats: the loss of a model that guesses the digits."""
        return float(np.log(10.0))


def passkey_data(data: PasskeyData, spec: BatchSpec) -> Data:
    """The ``data=passkey`` source (:data:`lcx.data.sources.SOURCES`): generated training rows
    and a fixed evaluation set, as :class:`lcx.data.config.PasskeyData` configures them.

    Raises:
      ValueError: a tokenizer other than ``byte``, or any error of :class:`PasskeyBatches`.
    """
    if data.tokenizer != "byte":
        raise ValueError("data=passkey is byte-level text; keep data.tokenizer=byte")
    train = PasskeyBatches(
        **spec.rows(),
        seed=spec.seed,
        digits=data.digits,
        min_depth=data.min_depth,
        max_depth=data.max_depth,
        recall_loss=data.recall_loss,
        filler=data.filler,
        loss_on=data.loss_on,
    )
    val = PasskeyEval(
        **spec.rows(val=True),
        digits=data.digits,
        depths=[float(d) for d in data.eval_depths],
        per_depth=data.eval_per_depth,
        seed=data.split_seed,
        filler=data.filler,
    )
    return Data(train, val, ByteTokenizer())
