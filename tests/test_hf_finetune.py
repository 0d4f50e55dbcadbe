"""``python -m lcx.train model=hf model.path=DIR data.tokenizer=DIR``: an imported tiny Qwen3 and a
tiny Gemma 3 (the committed transformers fixtures) fine-tuned for a few steps under a
context-parallel plan (ring for global layers, halo for sliding ones), then ``lcx.export`` writes a
checkpoint that imports back as the trained parameters bit for bit, as the same family, with the
run's tokenizer. The config edge refuses a missing path and a vocabulary smaller than the
tokenizer's.
"""

from __future__ import annotations

import json
import pathlib

import jax
import numpy as np
import pytest
from hydra import compose, initialize_config_module

import lcx.models as lm
from lcx.config import export_query, run_config
from lcx.export import run_export
from lcx.models.hf import from_pretrained
from lcx.training.resume import load_model

FIX = pathlib.Path(__file__).parent / "fixtures"


def _compose(name: str, overrides: list[str]):
    with initialize_config_module(config_module="lcx.conf", version_base="1.3"):
        return compose(config_name=name, overrides=overrides)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A BPE of 120 ids (the fixtures' vocabulary is 128) trained on the embedded real text."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from lcx.data.corpora import stdlib_corpus

    docs = list(stdlib_corpus().documents[:40])
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>"], limit_alphabet=80, show_progress=False)
    tok.train_from_iterator(docs, trainer)
    d = tmp_path_factory.mktemp("tok")
    tok.save(str(d / "tokenizer.json"))
    assert tok.get_vocab_size() <= 120
    return d


def _train(root: pathlib.Path, name: str, tokenizer_dir: pathlib.Path, devices, *extra: str):
    from lcx.training.loop import train

    cfg = _compose(
        "config",
        [
            "model=hf",
            f"model.path={FIX / name}",
            f"data.tokenizer={tokenizer_dir}",
            "plan=ring_halo",  # data 2 x context 4; zigzag chunks of 8 tokens hold halo's window 8 - 1
            "train.seq_len=64",
            "train.global_batch=2",
            "train.steps=3",
            "train.warmup_steps=0",
            "train.lr=0.01",
            "train.eval_every=0",
            f"checkpoint.dir={root / 'ckpt'}",
            "checkpoint.every=0",
            *extra,
        ],
    )
    config = run_config(cfg)
    with jax.numpy_dtype_promotion("standard"):
        out = train(config, root / "run", devices)
    return config, out


@pytest.mark.parametrize(
    "name, architecture",
    [
        ("hf_tiny_qwen3", "Qwen3ForCausalLM"),
        pytest.param("hf_tiny_gemma3", "Gemma3ForCausalLM", marks=pytest.mark.slow),
    ],
)
def test_finetune_an_import_under_cp_then_export(tmp_path, tokenizer_dir, devices, name, architecture):
    config, out = _train(tmp_path, name, tokenizer_dir, devices)
    assert config.pretrained == str(FIX / name) and config.model.vocab_size == 128
    assert config.resolved["pretrained"] == str(FIX / name)
    assert len(out.losses) == 3 and all(np.isfinite(out.losses))
    hf = tmp_path / "hf"
    run_export(export_query(_compose("export_config", [f"checkpoint.dir={tmp_path / 'ckpt'}", f"out={hf}"])), devices)
    written = json.loads((hf / "config.json").read_text())
    assert written["architectures"] == [architecture]
    assert (hf / "tokenizer.json").read_bytes() == (tokenizer_dir / "tokenizer.json").read_bytes()
    back, cfg = from_pretrained(hf)
    trained, _ = load_model(tmp_path / "ckpt", lm.hf.single_device_plan())
    for a, b in zip(jax.tree.leaves(trained), jax.tree.leaves(back), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # it started from the checkpoint's weights: 3 Adam steps of lr 0.01 move each weight by at most
    # about 0.03 (|update| <= lr per step, plus lr x weight decay x |w|), a fresh init by ~0.2 or more
    original, _ = from_pretrained(FIX / name)
    moved = [
        np.abs(np.asarray(a) - np.asarray(b)).max() for a, b in zip(jax.tree.leaves(original), jax.tree.leaves(back))
    ]
    assert 0 < max(moved) < 0.045, moved
    _transformers_agrees(hf, back)


def _transformers_agrees(directory: pathlib.Path, model) -> None:
    """Where torch and transformers are installed (not lcx's dependencies; CI has neither), the
    export loads with ``AutoModelForCausalLM.from_pretrained`` and gives lcx's logits."""
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError:
        return
    import jax.numpy as jnp

    tokens = np.random.default_rng(0).integers(0, 128, (2, 64)).astype(np.int32)
    tok = jnp.asarray(tokens)
    pos = jnp.broadcast_to(jnp.arange(64, dtype=jnp.int32), tok.shape)
    ours = np.asarray(model(tok, pos, jnp.zeros_like(tok), plan=lm.hf.single_device_plan()))
    hf = AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager").double().eval()
    with torch.no_grad():
        ref = hf(input_ids=torch.from_numpy(tokens).long()).logits.float().numpy()
    err = np.abs(ours - ref).max() / np.abs(ref).max()
    print(f"{directory}: transformers vs lcx max|diff|/max|logit| {err:.2e}")
    assert err < 5e-5


def test_model_hf_refusals(tmp_path, tokenizer_dir):
    with pytest.raises(ValueError, match="model=hf needs model.path=DIR"):
        run_config(_compose("config", ["model=hf"]))
    with pytest.raises(ValueError, match="no config.json"):
        run_config(_compose("config", ["model=hf", f"model.path={tmp_path}"]))
    # the stdlib BPE has 4,096 ids, the fixture's vocabulary 128
    with pytest.raises(ValueError, match=r"model.vocab_size=128 .*model.path=.*hf_tiny_qwen3.* 4096"):
        run_config(_compose("config", ["model=hf", f"model.path={FIX / 'hf_tiny_qwen3'}", "data=stdlib_bpe"]))
