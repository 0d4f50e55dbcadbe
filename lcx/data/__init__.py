"""Data: corpora (embedded stdlib default; the user's files in text, JSON lines, Parquet, Arrow and
ArrayRecord, :mod:`lcx.data.readers`), tokenizers, packing, the grain training pipeline
(:mod:`lcx.data.grain_stream`: workers, mixtures, per-process shards, exact resume), batching with
sequence layouts; one batch-stream interface (:mod:`lcx.data.stream`) and a registry of sources
(:mod:`lcx.data.sources`)."""

from lcx.data.config import DATA_CONFIGS, DataConfig, PasskeyData, StdlibData, TextData
from lcx.data.corpora import DOCUMENTS, STDLIB_SKIP_DIRS, STDLIB_SNAPSHOT, Corpus, stdlib_corpus, text_corpus
from lcx.data.corpus_source import corpus_data
from lcx.data.grain_stream import GrainBatches
from lcx.data.packing import BATCH_KEYS, Packer, pack_documents, unigram_entropy
from lcx.data.pipeline import Batches, EvalBatches, load_corpus, split_documents
from lcx.data.readers import READERS, Document, Reader
from lcx.data.sources import SOURCES, make_data
from lcx.data.stream import Batch, BatchSpec, BatchStream, Data, RowCursor, Rows, lay_out
from lcx.data.tokenizers import (
    TOKENIZERS,
    ByteTokenizer,
    HFTokenizer,
    Tokenizer,
    check_model_vocab,
    get_tokenizer,
    padded_vocab_size,
)

__all__ = [
    "Batch",
    "BATCH_KEYS",
    "Batches",
    "BatchSpec",
    "BatchStream",
    "ByteTokenizer",
    "check_model_vocab",
    "Corpus",
    "DATA_CONFIGS",
    "DataConfig",
    "Document",
    "DOCUMENTS",
    "corpus_data",
    "Data",
    "EvalBatches",
    "get_tokenizer",
    "GrainBatches",
    "HFTokenizer",
    "lay_out",
    "load_corpus",
    "make_data",
    "pack_documents",
    "Packer",
    "padded_vocab_size",
    "PasskeyData",
    "Reader",
    "READERS",
    "RowCursor",
    "Rows",
    "SOURCES",
    "split_documents",
    "stdlib_corpus",
    "STDLIB_SKIP_DIRS",
    "STDLIB_SNAPSHOT",
    "StdlibData",
    "TextData",
    "text_corpus",
    "Tokenizer",
    "TOKENIZERS",
    "unigram_entropy",
]
