"""Generate tests/fixtures/hf_tokenizer_parity: the ids transformers' ``AutoTokenizer`` gives a few
texts, for four small Hugging Face tokenizer directories, so that tests/test_tokenizers.py can
check, without transformers, that lcx's :class:`lcx.data.tokenizers.HFTokenizer` (the
``tokenizers`` library, BOS/EOS added by lcx's own rule) gives the same ids, BOS and EOS included.

transformers (and PyTorch) are not lcx dependencies; this script needs only transformers and
tokenizers, and imports nothing from lcx. Run it in a throwaway environment:

    python -m venv /tmp/tf && /tmp/tf/bin/pip install transformers tokenizers
    /tmp/tf/bin/python experiments/make_tokenizer_parity.py

The committed fixture was made with transformers 5.25.0 and tokenizers 0.23.3 (recorded in
``ids.json``). Each case directory holds a ``tokenizer.json`` trained here (deterministic, tiny)
and the ``tokenizer_config.json`` (and ``special_tokens_map.json``) a model repository has:

- ``llama3_style``: byte-level BPE whose post-processor adds ``<|begin_of_text|>``, config with
  no ``add_*_token`` flag (as Llama 3's);
- ``bos_eos_flags``: the post-processor adds BOS and EOS, and the config says so
  (``add_bos_token`` and ``add_eos_token`` true);
- ``gpt2_style``: GPT-2's ByteLevel post-processor (adds nothing), ``add_bos_token`` false;
- ``llama2_style``: SentencePiece-like BPE (Metaspace), post-processor ``<s> $A``,
  ``LlamaTokenizer`` config with ``add_bos_token`` true, ``add_eos_token`` false, and a
  ``special_tokens_map.json``.

The texts include one that spells a special token (``<|end_of_text|>``): both map it to the
special id. An empty text is not in the fixture: transformers gives it a BOS, lcx keeps an empty
document empty (:meth:`lcx.data.tokenizers.Tokenizer.encode_documents`). Nor is a character the
SentencePiece-like vocabulary lacks (its tokenizer is trained on the texts too): transformers 5's
``LlamaTokenizer`` rebuilds the tokenizer.json's BPE model with byte fallback and no unknown
token, and drops such a character, where the tokenizer.json as written (what lcx runs) gives
``<unk>``. Real Llama 2 tokenizer.json files have byte fallback and all 256 byte tokens, so there
the two agree.
"""

from __future__ import annotations

import argparse
import json
import pathlib

TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog.",
    "naïve café — ∑ 漢字 🙂\t tabs  and   spaces",
    "ends a document<|end_of_text|>and starts another",
    "x",
]
TRAIN = [
    "def add(a, b):\n    return a + b\n\nclass Fox:\n    pass\n",
    "The quick brown fox jumps over the lazy dog. The dog sleeps. ",
    "naïve café — ∑ 漢字 🙂 unicode text, with punctuation!",
] * 20


def byte_level(vocab_size: int = 320):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TRAIN, trainer)
    return tok


def metaspace(vocab_size: int = 110):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    tok.train_from_iterator(TRAIN + TEXTS, trainer)  # every character of TEXTS known: no <unk>
    return tok


def cases() -> dict[str, tuple]:
    from tokenizers import processors

    bl = byte_level()
    bos, eos = "<|begin_of_text|>", "<|end_of_text|>"
    ids = {t: bl.token_to_id(t) for t in (bos, eos)}
    fast = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos}
    ms = metaspace()
    return {
        "llama3_style": (
            bl,
            processors.TemplateProcessing(single=f"{bos} $A", special_tokens=list(ids.items())),
            fast,
            None,
        ),
        "bos_eos_flags": (
            bl,
            processors.TemplateProcessing(single=f"{bos} $A {eos}", special_tokens=list(ids.items())),
            {**fast, "add_bos_token": True, "add_eos_token": True},
            None,
        ),
        "gpt2_style": (
            bl,
            processors.ByteLevel(trim_offsets=False),
            {"tokenizer_class": "GPT2Tokenizer", "bos_token": eos, "eos_token": eos, "add_bos_token": False},
            None,
        ),
        "llama2_style": (
            ms,
            processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", ms.token_to_id("<s>"))]),
            {
                "tokenizer_class": "LlamaTokenizer",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "add_bos_token": True,
                "add_eos_token": False,
            },
            {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures/hf_tokenizer_parity")
    args = ap.parse_args()
    import tokenizers
    import transformers
    from tokenizers import Tokenizer

    out = pathlib.Path(args.out)
    result: dict = {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__, "texts": TEXTS}
    result["input_ids"] = {}
    for name, (base, post, config, special_map) in cases().items():
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        tok = Tokenizer.from_str(base.to_str())
        tok.post_processor = post
        (d / "tokenizer.json").write_text(tok.to_str(pretty=False))
        (d / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
        if special_map is not None:
            (d / "special_tokens_map.json").write_text(json.dumps(special_map, indent=1) + "\n")
        hf = transformers.AutoTokenizer.from_pretrained(str(d))
        result["input_ids"][name] = hf(TEXTS)["input_ids"]  # add_special_tokens=True: as a model sees text
        print(f"{name}: {type(hf).__name__}, {[len(x) for x in result['input_ids'][name]]} ids")
    ids = ",\n".join(
        f"  {json.dumps(name)}: [\n" + ",\n".join(f"   {json.dumps(x)}" for x in rows) + "\n  ]"
        for name, rows in result.pop("input_ids").items()
    )
    head = json.dumps(result, indent=1, ensure_ascii=False)[:-2]  # without the closing brace
    (out / "ids.json").write_text(f'{head},\n "input_ids": {{\n{ids}\n }}\n}}\n')


if __name__ == "__main__":
    main()
