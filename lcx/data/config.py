"""The typed ``data`` config of each source: one frozen dataclass per ``conf/data/<name>.yaml``.

These classes are the schema of the ``data=`` group (:func:`lcx.config.register` stores them in
Hydra's ConfigStore; :mod:`lcx.config.schema` checks a composed ``data`` section against them):
one definition per key, with its type. The values live in the YAML files, so no field has a
default, but ``add_bos`` / ``add_eos`` (None: the tokenizer's own rule) and the grain pipeline's
knobs (``workers``, ``prefetch``, ``shards``, ``mixture``), so that code building a config by hand
names only its source. Types are ``typing.Optional``, not ``X | None``: OmegaConf 2.3 reads only the former in
structured configs.
"""

# ruff: noqa: UP045 - OmegaConf 2.3 reads typing.Optional in structured configs, not PEP 604's X | None
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from lcx.data.corpora import check_document
from lcx.data.readers import check_format


def _check_pipeline(d: Any) -> None:
    """The grain pipeline's knobs of a corpus source (``data.workers``, ``prefetch``, ``shards``).

    Raises:
      ValueError: ``workers < 0``, ``prefetch < 1`` or ``shards < 1``; names the value and the fix.
    """
    if d.workers < 0:
        raise ValueError(
            f"data.workers={d.workers}: must be >= 0 (0: batches are built in the training process, by a "
            f"prefetch thread; N: N grain worker processes); e.g. data.workers=0"
        )
    if d.prefetch < 1:
        raise ValueError(
            f"data.prefetch={d.prefetch}: must be >= 1 batch buffered ahead (per worker); e.g. data.prefetch=2"
        )
    if d.shards is not None and d.shards < 1:
        raise ValueError(
            f"data.shards={d.shards}: must be >= 1, or null (one shard per part of the batch the processes hold)"
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class _CorpusOptions:
    """The fields every corpus source has besides where its text comes from (keyword-only, so
    each source lists its own fields first); documented on :class:`StdlibData`."""

    tokenizer: str
    val_fraction: float
    split_seed: int
    add_bos: Optional[bool] = None
    add_eos: Optional[bool] = None
    workers: int = 0
    prefetch: int = 2
    shards: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class StdlibData(_CorpusOptions):
    """``data=stdlib`` / ``data=stdlib_bpe``: the Python standard library's sources, embedded
    (``conf/data/stdlib.yaml``: byte tokens; ``conf/data/stdlib_bpe.yaml``: the embedded BPE).

    Attributes:
      name: ``stdlib`` or ``stdlib_bpe``.
      tokenizer: a registered name (:data:`lcx.data.tokenizers.TOKENIZERS`: ``byte``,
        ``stdlib_bpe``), or the path of a Hugging Face ``tokenizer.json`` or of a model directory
        holding one (:func:`lcx.data.tokenizers.get_tokenizer`).
      val_fraction: fraction of documents held out for validation, in (0, 1).
      split_seed: seed of the train/validation split (independent of ``train.seed``).
      add_bos, add_eos: put the tokenizer's BOS before (EOS after) every document; None: the
        tokenizer's own rule (:class:`lcx.data.tokenizers.HFTokenizer`). The one default here:
        configs built in code before these keys existed mean the tokenizer's own rule.
      workers, prefetch, shards: the grain pipeline's (:func:`_check_pipeline`).

    Raises:
      ValueError: a bad ``workers``, ``prefetch`` or ``shards`` (names the value and the fix).
    """

    name: str

    def __post_init__(self) -> None:
        _check_pipeline(self)


@dataclasses.dataclass(frozen=True)
class TextData(_CorpusOptions):
    """``data=text``: files, globs and directories (``conf/data/text.yaml``), and its presets
    ``data=jsonl`` / ``data=parquet`` / ``data=arrayrecord``, which set ``format``
    (:func:`lcx.data.corpora.text_corpus`).

    Attributes:
      name: ``text``, ``jsonl``, ``parquet`` or ``arrayrecord``.
      paths: files, directories and/or globs, relative to the launch directory
        (:mod:`lcx.data.paths`).
      format: ``auto`` (by suffix) or a format of :data:`lcx.data.readers.READERS`, for every file.
      text_field: the field or column that holds the text (JSON lines, Parquet, Arrow,
        ArrayRecord JSON records); None (``null``): ArrayRecord records are raw text.
      document: ``file`` (a text file or one record is a document) or ``directory`` (each
        directory in ``paths`` is one document).
      document_separator: text between the files of a ``directory`` document.
      tokenizer, val_fraction, split_seed, add_bos, add_eos, workers, prefetch, shards: as
        :class:`StdlibData`.
      mixture: null (one source: ``paths``), or a weighted mixture of sources: a list of
        ``{paths: [...], weight: w, name: ...}``, each entry overriding this section's source
        fields (``format``, ``text_field``, ``document``, ...; ``paths`` is required, ``name``
        defaults to ``source<i>``). Rows are drawn from the sources in proportion to their
        weights (``grain``'s ``MapDataset.mix``), :func:`mixture_sources`.

    Raises:
      ValueError: an unknown ``format`` or ``document`` (names the known ones); a bad
        ``workers``, ``prefetch``, ``shards`` or ``mixture`` entry (names the entry, the value
        and the fix).
    """

    name: str
    paths: list[str]
    format: str
    text_field: Optional[str]
    document: str
    document_separator: str
    mixture: Optional[list[dict[str, Any]]] = None

    def __post_init__(self) -> None:
        check_format(self.format)
        check_document(self.document)
        _check_pipeline(self)
        if self.mixture is not None:
            check_mixture(self.mixture, [f.name for f in dataclasses.fields(self)])


@dataclasses.dataclass(frozen=True)
class PasskeyData:
    """``data=passkey``: the synthetic retrieval task (``conf/data/passkey.yaml``,
    :mod:`lcx.data.passkey`).

    Attributes:
      name: ``passkey``.
      tokenizer: must be ``byte``.
      digits: digits of the key.
      min_depth, max_depth: where the key sits in the training rows, fractions of the row.
      recall_loss: also train on the key where it is stated.
      filler: the haystack's text (``sentences`` ...).
      loss_on: which tokens carry the loss (``answer`` ...).
      eval_depths: key depths of the evaluation set, fractions of the row.
      eval_per_depth: evaluation rows per depth.
      split_seed: seed of the evaluation set.
    """

    name: str
    tokenizer: str
    digits: int
    min_depth: float
    max_depth: float
    recall_loss: bool
    filler: str
    loss_on: str
    eval_depths: list[float]
    eval_per_depth: int
    split_seed: int


@dataclasses.dataclass(frozen=True)
class TasksData:
    """``data=tasks``: training rows in the long-context tasks' formats mixed with the embedded
    corpus (``conf/data/tasks.yaml``, :mod:`lcx.evals.training_rows`), drawn from the tasks'
    ``train`` split (:mod:`lcx.evals.splits`), disjoint from every evaluation example.

    Attributes:
      name: ``tasks``.
      tokenizer: a registered tokenizer name or a tokenizer.json path.
      tasks: names in :data:`lcx.evals.TASKS`, drawn with equal probability.
      corpus_fraction: share of the rows that are windows of the corpus (language-modelling loss)
        rather than task examples (loss on the answer), in [0, 1].
      prompt_loss: loss weight of a task row's prompt tokens, in [0, 1] (0: the answer alone).
      min_length: None, one example of ``train.seq_len`` tokens per task row; else task rows pack
        examples of lengths drawn uniformly from ``[min_length, room left]`` (own segment ids),
        more answers per row (training rows only; the validation rows stay one per row).
      repeat_fraction: share of the training rows that are corpus windows with spans written
        twice, the loss on the repeats (:func:`lcx.evals.training_rows.repeat_row`: the copy
        an induction head makes), in [0, 1 - ``corpus_fraction``].
      eval_rows: validation rows (same mix, own seeds).
      split_seed: seed of the validation rows.
      add_bos, add_eos: the tokenizer's rule (None: its own).
    """

    name: str
    tokenizer: str
    tasks: list[str]
    corpus_fraction: float
    prompt_loss: float
    eval_rows: int
    split_seed: int
    add_bos: Optional[bool] = None
    add_eos: Optional[bool] = None
    min_length: Optional[int] = None
    repeat_fraction: float = 0.0


MIXTURE_FIXED = frozenset({"name", "tokenizer", "add_bos", "add_eos", "workers", "prefetch", "shards", "mixture"})
"""Keys of the ``data`` section a mixture entry may not override: one tokenizer (one vocabulary)
and one pipeline serve every source (an entry's ``name`` names the source instead)."""


def check_mixture(entries: Any, fields: Sequence[str]) -> None:
    """Refuse a malformed ``data.mixture``, naming the entry, the value and the fix.

    Args:
      entries: the ``data.mixture`` list.
      fields: the keys of the ``data`` section (an entry may override those outside
        :data:`MIXTURE_FIXED`).

    Raises:
      ValueError: not a non-empty list of mappings; an entry without ``paths``, without a
        ``weight`` or with a weight that is not a finite number > 0; an unknown or fixed key; two
        entries of one ``name``.
    """
    example = "data.mixture=[{paths: [long.jsonl], weight: 3}, {paths: [short.jsonl], weight: 1}]"
    if not isinstance(entries, list | tuple) or not entries:
        raise ValueError(f"data.mixture={entries!r}: must be null or a non-empty list of sources, e.g. {example}")
    allowed = sorted(({*fields} - MIXTURE_FIXED) | {"weight", "name"})
    names: set[str] = set()
    for i, e in enumerate(entries):
        where = f"data.mixture[{i}]"
        if not isinstance(e, Mapping):
            raise ValueError(f"{where}={e!r}: must be a mapping like {{paths: [a.jsonl], weight: 1}}; e.g. {example}")
        for k in e:
            if k in MIXTURE_FIXED and k != "name":
                raise ValueError(
                    f"{where}.{k}: one {k} serves every source of a mixture; set data.{k} instead of the entry's"
                )
            if k not in allowed:
                raise ValueError(f"{where}.{k}: unknown key; an entry reads {', '.join(allowed)}")
        paths = e.get("paths")
        if not paths or paths == "???":
            raise ValueError(f"{where} has no paths: every source needs files or globs, e.g. {where}.paths=[a.jsonl]")
        w = e.get("weight")
        if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w) or w <= 0:
            raise ValueError(
                f"{where}.weight={w!r}: must be a finite number > 0 (the source's share of the rows is its weight / "
                f"the sum of the weights); e.g. {where}.weight=1"
            )
        name = str(e.get("name", f"source{i}"))
        if name in names:
            raise ValueError(f"{where}.name={name!r}: two sources share the name; give each entry its own name")
        names.add(name)


def mixture_sources(data: Any) -> list[tuple[str, float, Any]]:
    """The sources of a corpus ``data`` config: ``(name, weight, config)`` each.

    One source (``data.mixture`` null, or ``data=stdlib``): ``[(data.name, 1.0, data)]``. A
    mixture: one per entry, named by its ``name`` (default ``source<i>``), its config ``data``
    with the entry's keys overriding (``paths``, ``text_field``, ...) and no mixture.
    """
    entries = getattr(data, "mixture", None)
    if entries is None:
        return [(data.name, 1.0, data)]
    out = []
    for i, e in enumerate(entries):
        over = {k: v for k, v in e.items() if k not in ("weight", "name")}
        out.append(
            (str(e.get("name", f"source{i}")), float(e["weight"]), dataclasses.replace(data, mixture=None, **over))
        )
    return out


DataConfig = StdlibData | TextData | PasskeyData | TasksData
"""The ``data`` section of a run, whichever source it names."""

DATA_CONFIGS: dict[str, type] = {
    "stdlib": StdlibData,
    "stdlib_bpe": StdlibData,
    "text": TextData,
    "jsonl": TextData,  # data=text with format=jsonl
    "parquet": TextData,  # data=text with format=parquet
    "arrayrecord": TextData,  # data=text with format=arrayrecord
    "passkey": PasskeyData,
    "tasks": TasksData,
}
"""The typed config of each data source, by its ``data.name``."""


__all__ = [
    "DATA_CONFIGS",
    "MIXTURE_FIXED",
    "DataConfig",
    "PasskeyData",
    "StdlibData",
    "TasksData",
    "TextData",
    "check_mixture",
    "mixture_sources",
]
