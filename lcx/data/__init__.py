"""Data: corpora (embedded stdlib default), tokenizers, packing, batching with sequence layouts;
one batch-stream interface (:mod:`lcx.data.stream`) and a registry of sources
(:mod:`lcx.data.sources`)."""

from lcx.data.corpora import (
    STDLIB_SKIP_DIRS as STDLIB_SKIP_DIRS,
    Corpus as Corpus,
    stdlib_corpus as stdlib_corpus,
    text_corpus as text_corpus,
)
from lcx.data.packing import (
    BATCH_KEYS as BATCH_KEYS,
    Packer as Packer,
    pack_documents as pack_documents,
    unigram_entropy as unigram_entropy,
)
from lcx.data.pipeline import (
    Batches as Batches,
    EvalBatches as EvalBatches,
    corpus_data as corpus_data,
    lay_out as lay_out,
    load_corpus as load_corpus,
    split_documents as split_documents,
)
from lcx.data.sources import SOURCES as SOURCES, make_data as make_data
from lcx.data.stream import Batch as Batch, BatchSpec as BatchSpec, BatchStream as BatchStream, Data as Data
from lcx.data.tokenizers import (
    TOKENIZERS as TOKENIZERS,
    ByteTokenizer as ByteTokenizer,
    Tokenizer as Tokenizer,
    get_tokenizer as get_tokenizer,
)
