"""Data: corpora (embedded stdlib default), tokenizers, packing, batching with sequence layouts."""

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
    Data as Data,
    EvalBatches as EvalBatches,
    lay_out as lay_out,
    load_corpus as load_corpus,
    make_data as make_data,
    split_documents as split_documents,
)
from lcx.data.tokenizers import (
    TOKENIZERS as TOKENIZERS,
    ByteTokenizer as ByteTokenizer,
    Tokenizer as Tokenizer,
    get_tokenizer as get_tokenizer,
)
