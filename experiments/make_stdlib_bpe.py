"""Generate lcx/data/stdlib_bpe.json: the embedded BPE tokenizer (``data.tokenizer=stdlib_bpe``).

A byte-level BPE (GPT-2's scheme: the ByteLevel pre-tokenizer maps every byte to a printable
character, so any text encodes, with no unknown token) of 4,096 ids, trained with Hugging Face's
``tokenizers`` on the TRAINING split of the embedded standard library corpus: the 731 non-empty
documents of :func:`lcx.data.corpora.stdlib_corpus`, less the 15 that ``data=stdlib`` holds out
for validation (``data.val_fraction=0.02``, ``data.split_seed=0``,
:func:`lcx.data.pipeline.split_documents`), so the validation loss of ``data=stdlib_bpe`` is
measured on text the tokenizer never saw.

Ids 0 and 1 are the special tokens ``<|bos|>`` and ``<|eos|>``, then the 256 byte characters,
then 3,838 merges. The post-processor (a ``TemplateProcessing``: ``<|bos|> $A <|eos|>``) says
that each document gets both, which is the rule lcx reads (:class:`lcx.data.tokenizers.HFTokenizer`).

    python experiments/make_stdlib_bpe.py             # writes lcx/data/stdlib_bpe.json, prints its sha256
    python experiments/make_stdlib_bpe.py --check     # retrains and compares with the committed file

Training is deterministic (the same bytes with 1 or 2 threads) for a given ``tokenizers``
release; the committed file was made with tokenizers 0.23.3 (:data:`GENERATED_WITH`), in about
3 seconds on 2 cores. The file is written compact (no indentation), about 100 KB.
"""

from __future__ import annotations

import argparse
import hashlib
import pathlib
import sys

from lcx.data.corpora import stdlib_corpus
from lcx.data.pipeline import split_documents
from lcx.data.tokenizers import STDLIB_BPE

VOCAB_SIZE = 4096
SPECIAL_TOKENS = ("<|bos|>", "<|eos|>")
VAL_FRACTION, SPLIT_SEED = 0.02, 0  # conf/data/stdlib.yaml's split
GENERATED_WITH = "0.23.3"
"""The ``tokenizers`` release that wrote the committed file (another may merge ties differently)."""


def split() -> tuple[list[str], list[str]]:
    """The training and validation documents of ``data=stdlib`` (non-empty, in corpus order)."""
    docs = [d for d in stdlib_corpus().documents if d]
    train, val = split_documents(len(docs), VAL_FRACTION, SPLIT_SEED)
    return [docs[i] for i in train], [docs[i] for i in val]


def train_bpe(texts: list[str]) -> str:
    """The tokenizer trained on ``texts``, as compact tokenizer.json text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    bos, eos = SPECIAL_TOKENS
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", special_tokens=[(t, tok.token_to_id(t)) for t in SPECIAL_TOKENS]
    )
    return tok.to_str(pretty=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=f"lcx/data/{STDLIB_BPE}", help="where to write the tokenizer.json")
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = ap.parse_args()
    import tokenizers

    train, val = split()
    text = train_bpe(train)
    data = text.encode("utf-8")
    digest = hashlib.sha256(data).hexdigest()
    out = pathlib.Path(args.out)
    if args.check:
        same = out.read_bytes() == data
        print(
            f"{out}: {'identical' if same else 'DIFFERS'} (retrained sha256 {digest}, tokenizers {tokenizers.__version__})"
        )
        return 0 if same else 1
    out.write_bytes(data)
    tok = tokenizers.Tokenizer.from_str(text)
    n_tokens = sum(len(e.ids) for e in tok.encode_batch(val, add_special_tokens=False))
    n_bytes = sum(len(d.encode("utf-8")) for d in val)
    print(
        f"{out}: {len(data):,} bytes, sha256 {digest}; vocab {tok.get_vocab_size()}, trained on {len(train)} "
        f"documents; validation split: {len(val)} documents, {n_bytes:,} bytes -> {n_tokens:,} tokens "
        f"({n_bytes / n_tokens:.3f} bytes per token); tokenizers {tokenizers.__version__}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
