"""The typed ``data`` config of each source: one frozen dataclass per ``conf/data/<name>.yaml``.

These classes are the schema of the ``data=`` group (:func:`lcx.config.register` stores them in
Hydra's ConfigStore; :mod:`lcx.config.schema` checks a composed ``data`` section against them):
one definition per key, with its type. The values live in the YAML files, so no field has a
default, but ``add_bos`` / ``add_eos`` (None: the tokenizer's own rule), which configs built in
code before those keys existed leave out. Types are ``typing.Optional``, not ``X | None``: OmegaConf 2.3 reads only the former in
structured configs.
"""

# ruff: noqa: UP045 - OmegaConf 2.3 reads typing.Optional in structured configs, not PEP 604's X | None
from __future__ import annotations

import dataclasses
from typing import Optional

from lcx.data.corpora import check_document
from lcx.data.readers import check_format


@dataclasses.dataclass(frozen=True)
class StdlibData:
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
    """

    name: str
    tokenizer: str
    val_fraction: float
    split_seed: int
    add_bos: Optional[bool] = None
    add_eos: Optional[bool] = None


@dataclasses.dataclass(frozen=True)
class TextData:
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
      tokenizer, val_fraction, split_seed, add_bos, add_eos: as :class:`StdlibData`.

    Raises:
      ValueError: an unknown ``format`` or ``document`` (names the known ones).
    """

    name: str
    paths: list[str]
    format: str
    text_field: Optional[str]
    document: str
    document_separator: str
    tokenizer: str
    val_fraction: float
    split_seed: int
    add_bos: Optional[bool] = None
    add_eos: Optional[bool] = None

    def __post_init__(self):
        check_format(self.format)
        check_document(self.document)


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


DataConfig = StdlibData | TextData | PasskeyData
"""The ``data`` section of a run, whichever source it names."""

DATA_CONFIGS: dict[str, type] = {
    "stdlib": StdlibData,
    "stdlib_bpe": StdlibData,
    "text": TextData,
    "jsonl": TextData,  # data=text with format=jsonl
    "parquet": TextData,  # data=text with format=parquet
    "arrayrecord": TextData,  # data=text with format=arrayrecord
    "passkey": PasskeyData,
}
"""The typed config of each data source, by its ``data.name``."""


__all__ = ["DATA_CONFIGS", "DataConfig", "PasskeyData", "StdlibData", "TextData"]
