"""Data: corpora (embedded stdlib default), tokenizers, packing, batching with sequence layouts;
one batch-stream interface (:mod:`lcx.data.stream`) and a registry of sources
(:mod:`lcx.data.sources`)."""

from lcx.data.corpora import (
    STDLIB_SKIP_DIRS as STDLIB_SKIP_DIRS,
)
from lcx.data.corpora import (
    Corpus as Corpus,
)
from lcx.data.corpora import (
    stdlib_corpus as stdlib_corpus,
)
from lcx.data.corpora import (
    text_corpus as text_corpus,
)
from lcx.data.packing import (
    BATCH_KEYS as BATCH_KEYS,
)
from lcx.data.packing import (
    Packer as Packer,
)
from lcx.data.packing import (
    pack_documents as pack_documents,
)
from lcx.data.packing import (
    unigram_entropy as unigram_entropy,
)
from lcx.data.pipeline import (
    Batches as Batches,
)
from lcx.data.pipeline import (
    EvalBatches as EvalBatches,
)
from lcx.data.pipeline import (
    corpus_data as corpus_data,
)
from lcx.data.pipeline import (
    load_corpus as load_corpus,
)
from lcx.data.pipeline import (
    split_documents as split_documents,
)
from lcx.data.sources import SOURCES as SOURCES
from lcx.data.sources import make_data as make_data
from lcx.data.stream import Batch as Batch
from lcx.data.stream import BatchSpec as BatchSpec
from lcx.data.stream import BatchStream as BatchStream
from lcx.data.stream import Data as Data
from lcx.data.stream import Rows as Rows
from lcx.data.stream import lay_out as lay_out
from lcx.data.tokenizers import (
    TOKENIZERS as TOKENIZERS,
)
from lcx.data.tokenizers import (
    ByteTokenizer as ByteTokenizer,
)
from lcx.data.tokenizers import (
    Tokenizer as Tokenizer,
)
from lcx.data.tokenizers import (
    get_tokenizer as get_tokenizer,
)
