"""Generate tests/fixtures/hf_tiny_llama/: a random 2-layer Hugging Face LlamaForCausalLM and its
reference logits, for tests/test_hf.py (which needs neither torch nor transformers).

Run ONCE, only when the fixture must change, in an environment with torch and transformers
(torch is ~1.2 GB; it is deliberately not a dependency of lcx or of its tests):

    python -m venv /tmp/hfenv
    /tmp/hfenv/bin/pip install torch==2.13.0 transformers numpy safetensors
    /tmp/hfenv/bin/python experiments/make_hf_fixture.py            # writes the fixture

Made with torch 2.13.0+cpu and transformers 5.24.0. What it writes (about 0.5 MB):

- ``config.json`` (written by ``save_pretrained``): vocab 256, hidden 64, 2 layers, 4 query
  heads and 2 KV heads of 16, MLP 128, untied head, plain RoPE (theta 10000).
- ``model-0000{1,2}-of-00002.safetensors`` + ``model.safetensors.index.json``: the weights,
  float32, split into two shards so the loader's index path is exercised.
- ``config_llama3.json``, ``config_yarn.json``: the same model with Llama 3.1 (factor 8, band
  edges 1/4, original length 64) and YaRN (factor 4, beta 32/1, original length 64,
  max_position_embeddings 256 so that every transformers version derives the same factor)
  RoPE scaling. Same weights; tests copy a variant's config next to the shards.
- ``tokens.npy``, ``positions.npy``: int32 ``[2, 24]``; row 0 at positions 0..23, row 1 at
  40..63 (HF's causal mask is by index; both rows are increasing, so it equals lcx's
  position-causal mask).
- ``logits_{default,llama3,yarn}.npy``: float32 ``[2, 24, 256]`` logits of the model run in
  float64 (``model.double()``, eager attention). transformers forms RoPE phases in float32
  even then; at positions <= 63 that costs < 4e-6 rad, far below the test tolerance.

Weights are normal(0, 0.2) (initializer_range; ten times Llama's 0.02, so attention patterns
and the logits are far from uniform) and the RMSNorm gains are 1 + 0.2 normal: a loader that
swapped two gains, or transposed a projection, could not match.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil

import numpy as np
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "hf_tiny_llama"

BASE = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    initializer_range=0.2,
    tie_word_embeddings=False,
    attention_bias=False,
    mlp_bias=False,
    hidden_act="silu",
)
ROPE = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "llama3": {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    "yarn": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "original_max_position_embeddings": 64,
    },
}


def config(variant: str) -> LlamaConfig:
    return LlamaConfig(**BASE, rope_parameters=dict(ROPE[variant]), attn_implementation="eager")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=pathlib.Path, default=OUT)
    args = ap.parse_args()
    out: pathlib.Path = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)

    torch.manual_seed(0)
    model = LlamaForCausalLM(config("default")).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    model.save_pretrained(out, max_shard_size="300KB")  # two shards + index
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}

    rng = np.random.default_rng(0)
    tokens = rng.integers(0, BASE["vocab_size"], (2, 24)).astype(np.int32)
    positions = np.stack([np.arange(24), 40 + np.arange(24)]).astype(np.int32)
    np.save(out / "tokens.npy", tokens)
    np.save(out / "positions.npy", positions)

    for variant in ROPE:
        cfg = config(variant)
        if variant != "default":
            (out / f"config_{variant}.json").write_text(cfg.to_json_string())
        m = LlamaForCausalLM(cfg).eval()
        m.load_state_dict(state)
        m = m.double()
        with torch.no_grad():
            logits = m(
                input_ids=torch.from_numpy(tokens).long(), position_ids=torch.from_numpy(positions).long()
            ).logits
        np.save(out / f"logits_{variant}.npy", logits.float().numpy())
        print(variant, "logit std", float(logits.std()), "rotary scaling", float(m.model.rotary_emb.attention_scaling))

    (out / "VERSIONS.json").write_text(
        json.dumps({"torch": torch.__version__, "transformers": transformers.__version__}, indent=1) + "\n"
    )
    total = sum(p.stat().st_size for p in out.iterdir())
    print(f"wrote {out} ({total / 1e6:.2f} MB): {sorted(p.name for p in out.iterdir())}")


if __name__ == "__main__":
    main()
