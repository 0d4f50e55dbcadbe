"""Generate tests/fixtures/hf_tiny_{qwen2,qwen3,gemma3,gemma3_mm}/: random transformers models of the
families lcx imports beyond Llama and Mistral, with their reference logits, for
tests/test_hf_families.py (which needs neither torch nor transformers).

Run only when the fixtures must change, where torch and transformers are installed (not lcx's
dependencies):

    python3 -m venv /work/torchvenv
    /work/torchvenv/bin/pip install torch-2.13.0+cpu-...whl transformers safetensors numpy
    /work/torchvenv/bin/python experiments/make_hf_family_fixtures.py

Made with torch 2.13.0+cpu and transformers 5.25.0 (VERSIONS.json in each directory). Each holds
``config.json`` + ``model.safetensors`` from ``save_pretrained`` (float32), ``tokens.npy`` /
``positions.npy`` (int32 ``[2, 64]``: row 0 at positions 0..63, row 1 at 40..103; transformers
masks by index and lcx by position, equal for increasing rows) and ``logits.npy`` (float32
``[2, 64, 128]``, the model run in float64 with eager attention). 64 tokens split into 8 shards
of 8 for the context-parallel parity test.

- ``hf_tiny_qwen2``: Qwen2ForCausalLM (Qwen2.5's architecture), q/k/v biases (random, not
  transformers' zero init, so a dropped bias cannot match), untied, GQA 4:2, 2 layers.
- ``hf_tiny_qwen3``: Qwen3ForCausalLM, q/k RMSNorm per head, tied embeddings, GQA 4:1, 2 layers.
- ``hf_tiny_gemma3``: Gemma3ForCausalLM, 7 layers (5 sliding with window 8, 1 global, 1 sliding:
  Gemma 3's 5:1 pattern with a remainder layer), RoPE base 10K on sliding layers and 1M with x8
  linear scaling on the global one, QK-norm, sandwich norms, GeGLU, sqrt(d) embeddings,
  ``query_pre_attn_scalar`` 12 (not the head size 8, so scaling by the head size cannot match),
  tied, GQA 4:2.
- ``hf_tiny_gemma3_mm``: Gemma3ForConditionalGeneration (a tiny SigLIP tower besides) whose
  language model is a 2-layer Gemma 3 (pattern 1:1, window 8); logits of text-only input.

Weights are normal(0, 0.2); every RMSNorm gain is 1 + 0.2 normal (Gemma's stored ``w`` is 0.2
normal, its gain ``1 + w``).
"""

from __future__ import annotations

import pathlib
import shutil
import sys

import torch
from transformers import (
    Gemma3Config,
    Gemma3ForCausalLM,
    Gemma3ForConditionalGeneration,
    Gemma3TextConfig,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    SiglipVisionConfig,
)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from make_hf_mistral_fixture import write  # noqa: E402 - the sibling script, run from anywhere

FIX = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures"
T = 64
DIMS = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=4,
    head_dim=8,
    max_position_embeddings=256,
    initializer_range=0.2,
    rms_norm_eps=1e-6,
    attn_implementation="eager",
)
GEMMA_ROPE = dict(rope_scaling={"rope_type": "linear", "factor": 8.0}, rope_theta=1e6, rope_local_base_freq=1e4)
GEMMA = dict(DIMS, query_pre_attn_scalar=12, sliding_window=8, tie_word_embeddings=True, **GEMMA_ROPE)


def _text_mm() -> Gemma3Config:
    text = Gemma3TextConfig(**{**GEMMA, "num_hidden_layers": 2, "num_key_value_heads": 2})
    text.layer_types = ["sliding_attention", "full_attention"]
    vision = SiglipVisionConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
    )
    return Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4, attn_implementation="eager")


MODELS = {
    "hf_tiny_qwen2": (Qwen2ForCausalLM, lambda: Qwen2Config(**DIMS, num_hidden_layers=2, num_key_value_heads=2)),
    "hf_tiny_qwen3": (
        Qwen3ForCausalLM,
        lambda: Qwen3Config(**DIMS, num_hidden_layers=2, num_key_value_heads=1, tie_word_embeddings=True),
    ),
    "hf_tiny_gemma3": (
        Gemma3ForCausalLM,
        lambda: Gemma3TextConfig(**GEMMA, num_hidden_layers=7, num_key_value_heads=2),
    ),
    "hf_tiny_gemma3_mm": (Gemma3ForConditionalGeneration, _text_mm),
}


def make(name: str, seed: int) -> None:
    cls, config = MODELS[name]
    out = FIX / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    torch.manual_seed(seed)
    model = cls(config()).float().eval()
    gemma = "gemma" in name
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_((0.0 if gemma else 1.0) + 0.2 * torch.randn_like(p))
            elif n.endswith("bias"):
                p.copy_(0.2 * torch.randn_like(p))
    if name == "hf_tiny_gemma3_mm":  # text only: no image token (id 262144 is outside this vocab anyway)
        assert model.config.image_token_id >= DIMS["vocab_size"]
    write(model, out, seed, DIMS["vocab_size"], T)


if __name__ == "__main__":
    for i, name in enumerate(MODELS):
        make(name, seed=11 + i)
