"""Generate tests/fixtures/hf_tiny_{mistral,llama_tied}/: random transformers MistralForCausalLM
(sliding window 8, sequence 64) and LlamaForCausalLM (tied embeddings) with their reference
logits, for tests/test_hf_mistral.py (which needs neither torch nor transformers).

Run only when the fixtures must change, where torch and transformers are installed (not lcx's
dependencies):

    python3 -m venv /work/torchvenv
    /work/torchvenv/bin/pip install torch-2.13.0+cpu-...whl transformers safetensors numpy
    /work/torchvenv/bin/python experiments/make_hf_mistral_fixture.py

Made with torch 2.13.0+cpu and transformers 5.25.0 (VERSIONS.json). Each directory (~100 KB):
``config.json`` + ``model.safetensors`` from ``save_pretrained`` (float32), ``tokens.npy`` /
``positions.npy`` (int32 ``[2, 64]``: row 0 at positions 0..63, row 1 at 40..103; transformers
masks by index and lcx by position, equal for increasing rows) and ``logits.npy`` (float32
``[2, 64, 128]``, the model run in float64 with eager attention; 64 tokens split into 8 shards of
8 for the context-parallel parity test of tests/test_hf_families.py). Both models: vocab 128, hidden
32, 2 layers, 4 query heads and 2 KV heads of 8 (GQA), MLP 64, weights normal(0, 0.2), RMSNorm
gains 1 + 0.2 normal (so a swapped gain or a transposed projection cannot match). Mistral's
window of 8 makes 56 of 64 positions see a truncated context: a model that ignored the window,
or placed it one token off, differs at those positions by far more than the tolerance.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import sys

import numpy as np
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from make_hf_fixture import BASE  # noqa: E402 - the sibling script, run from anywhere

FIX = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures"
# make_hf_fixture.py's model, smaller (biases and tying are set per class below)
DIMS = {k: v for k, v in BASE.items() if k not in ("attention_bias", "mlp_bias", "tie_word_embeddings")}
DIMS.update(vocab_size=128, hidden_size=32, intermediate_size=64, head_dim=8, max_position_embeddings=128)
DIMS.update(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, attn_implementation="eager")
MODELS = {
    "hf_tiny_mistral": (MistralForCausalLM, MistralConfig(**DIMS, sliding_window=8, tie_word_embeddings=False)),
    "hf_tiny_llama_tied": (LlamaForCausalLM, LlamaConfig(**DIMS, tie_word_embeddings=True)),
}


def make(name: str, seed: int) -> None:
    cls, cfg = MODELS[name]
    out = FIX / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    torch.manual_seed(seed)
    model = cls(cfg).float().eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    write(model, out, seed, DIMS["vocab_size"])


def write(model, out: pathlib.Path, seed: int, vocab: int, T: int = 64) -> None:
    """Save ``model`` (``save_pretrained``, float32) in ``out`` with its inputs and float64 logits:
    tokens ``[2, T]`` from ``seed``, row 0 at positions 0..T-1, row 1 at 40..T+39."""
    model.save_pretrained(out)
    (out / "generation_config.json").unlink(missing_ok=True)
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, (2, T)).astype(np.int32)
    positions = np.stack([np.arange(T), 40 + np.arange(T)]).astype(np.int32)
    np.save(out / "tokens.npy", tokens)
    np.save(out / "positions.npy", positions)
    m = model.double()
    with torch.no_grad():
        logits = m(input_ids=torch.from_numpy(tokens).long(), position_ids=torch.from_numpy(positions).long()).logits
    np.save(out / "logits.npy", logits.float().numpy())
    (out / "VERSIONS.json").write_text(
        json.dumps({"torch": torch.__version__, "transformers": transformers.__version__}, indent=1) + "\n"
    )
    total = sum(p.stat().st_size for p in out.iterdir())
    print(f"wrote {out} ({total / 1e3:.0f} KB), logit max {float(logits.abs().max()):.3f}")


if __name__ == "__main__":
    for i, name in enumerate(MODELS):
        make(name, seed=i + 1)
