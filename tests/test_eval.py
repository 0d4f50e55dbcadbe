"""Retrieval evaluation: ``python -m lcx.eval checkpoint.dir=D`` on a 2-step passkey checkpoint
writes eval.json (one result per length x depth) and a heatmap PNG; the plan is re-validated per
length; without matplotlib the heatmap error names the ``plots`` extra."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from _compile_cache import compile_cache
from hydra import compose, initialize_config_module

from lcx.config import run_config
from lcx.sharding import PlanError
from lcx.training.retrieval import grid, write_heatmap


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory):
    """The evaluations below repeat each other's programs: compile each once."""
    with compile_cache(tmp_path_factory.mktemp("xla_cache")):
        yield


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, devices):
    from lcx.training.loop import train

    root = tmp_path_factory.mktemp("passkey")
    with initialize_config_module(config_module="lcx.conf", version_base="1.3"):
        cfg = compose(
            config_name="config",
            overrides=[
                "model=tiny",
                "plan=allgather",
                "data=passkey",
                "train.seq_len=256",
                "train.global_batch=2",
                "train.steps=2",
                "train.warmup_steps=1",
                "train.eval_every=0",
                f"checkpoint.dir={root / 'ckpt'}",
                "checkpoint.every=0",
            ],
        )
    with jax.numpy_dtype_promotion("standard"):  # optax's Adam: float ** int32 step
        train(run_config(cfg), root / "run", devices)
    return root / "ckpt"


def _eval_config(*overrides):
    """The typed value ``lcx.eval`` builds from its composed config."""
    from lcx.config import eval_query

    with initialize_config_module(config_module="lcx.conf", version_base="1.3"):
        return eval_query(compose(config_name="eval_config", overrides=list(overrides)))


@pytest.mark.slow
def test_eval_grid_json_and_heatmap(checkpoint, tmp_path, devices):
    from lcx.eval import run_eval

    cfg = _eval_config(
        f"checkpoint.dir={checkpoint}", "eval.lengths=[256,512]", "eval.depths=[0.0,1.0]", "eval.per_depth=3"
    )
    rep = run_eval(cfg, tmp_path, devices)
    saved = json.loads((tmp_path / "eval.json").read_text())
    assert saved["step"] == 2 and saved["train_seq_len"] == 256 and saved["plan"] == "allgather"
    res = saved["results"]
    assert [(r["seq_len"], r["depth"], r["rows"]) for r in res] == [
        (256, 0.0, 3),
        (256, 1.0, 3),
        (512, 0.0, 3),
        (512, 1.0, 3),
    ]
    for r in res:
        assert 0 <= r["exact_match"] <= r["digit_accuracy"] <= 1 and np.isfinite(r["answer_nll"])
    # depth 0 puts the key far from the question, depth 1 right before it
    assert res[0]["key_to_answer_tokens"] > 100 > res[1]["key_to_answer_tokens"]
    assert res[2]["key_to_answer_tokens"] > res[0]["key_to_answer_tokens"]
    assert set(saved["exact_match_by_length"]) == {"256", "512"}
    png = (tmp_path / "passkey_heatmap.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and rep["heatmap_writer"] in ("matplotlib", "plain")
    lengths, depths, v = grid(res)
    assert lengths == [256, 512] and depths == [0.0, 1.0] and v.shape == (2, 2)


@pytest.mark.slow
def test_each_length_is_validated_against_the_plan(checkpoint, tmp_path, devices):
    from lcx.eval import run_eval

    # zigzag over 4 context devices needs a multiple of 8 tokens
    with pytest.raises(PlanError, match="260"):
        run_eval(_eval_config(f"checkpoint.dir={checkpoint}", "eval.lengths=[260]"), tmp_path, devices)
    with pytest.raises(ValueError, match="shorter than the passkey task needs"):
        run_eval(_eval_config(f"checkpoint.dir={checkpoint}", "eval.lengths=[64]"), tmp_path, devices)
    with pytest.raises(FileNotFoundError):
        run_eval(_eval_config(f"checkpoint.dir={tmp_path / 'none'}"), tmp_path, devices)


@pytest.mark.slow
def test_cli_writes_eval_json(checkpoint, tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "lcx.eval",
            f"checkpoint.dir={checkpoint}",
            "eval.lengths=[256]",
            "eval.depths=[0.5]",
            "eval.per_depth=2",
            f"hydra.run.dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "exact match" in p.stderr
    assert json.loads((tmp_path / "eval.json").read_text())["results"][0]["rows"] == 2
    assert (tmp_path / "passkey_heatmap.png").exists()


def test_heatmap_is_a_png_and_names_the_extra_without_matplotlib(tmp_path, monkeypatch):
    results = [
        {"seq_len": s, "depth": d, "exact_match": x} for s, d, x in [(256, 0.0, 0.0), (256, 1.0, 1.0), (512, 0.0, 0.5)]
    ]  # (512, 1.0) missing: NaN cell
    assert write_heatmap(results, tmp_path / "h.png") == "matplotlib"
    assert (tmp_path / "h.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed: import raises
    with pytest.raises(ImportError, match=r"pip install 'lcx\[plots\]'"):
        write_heatmap(results, tmp_path / "g.png")
    assert not (tmp_path / "g.png").exists()


@pytest.mark.slow
def test_vocab_tiled_evaluation_equals_the_whole_logits(checkpoint, devices):
    # a run trained with memory.vocab_tiling evaluates in the same tiles: same argmax, same NLL
    from lcx.sharding import bind
    from lcx.sharding.config import preset
    from lcx.training.resume import load_model
    from lcx.training.retrieval import passkey_grid

    mp = bind(preset("allgather"), devices)
    model, _ = load_model(checkpoint, mp)
    kw = dict(lengths=[256, 512], depths=[0.0, 0.5], per_depth=2, global_batch=2)
    whole = passkey_grid(model, mp, **kw)
    tiled = passkey_grid(model, mp, **kw, vocab_tiling=4)
    for a, b in zip(tiled, whole, strict=True):
        assert {k: v for k, v in a.items() if k != "answer_nll"} == {k: v for k, v in b.items() if k != "answer_nll"}
        np.testing.assert_allclose(a["answer_nll"], b["answer_nll"], rtol=1e-6)
    with pytest.raises(ValueError, match="memory.vocab_tiling=3 does not divide the local sequence of 64 tokens"):
        passkey_grid(model, mp, **{**kw, "lengths": [256]}, vocab_tiling=3)
