"""Optimizer-state and parameter host offload (``memory.offload_optimizer`` / ``offload_params``):
the state lives in ``pinned_host`` memory between steps under the plan's sharding, the losses
equal the plain step's, and checkpoints save, resume exactly and restore across memory kinds."""

import shutil

import jax
import numpy as np
import pytest
from _compile_cache import compile_cache
from hydra import compose, initialize_config_module

from lcx.config import run_config

# real training runs (one with Llama 3's vocabulary): the floor stack (-m 'not slow') skips them
pytestmark = pytest.mark.slow

OFFLOAD = ("memory.offload_optimizer=true", "memory.offload_params=true")


def _config(*overrides):
    with initialize_config_module(config_module="lcx.conf", version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def _train(run_dir, *overrides, seq_len=256):
    from lcx.training.loop import train

    # 2 warmup steps: a run's first 2 rates (lr/2, lr) then do not depend on train.steps, so a
    # 2-step run resumed with train.steps=4 takes the 4-step run's exact updates
    cfg = _config(f"train.seq_len={seq_len}", "train.eval_every=0", "train.warmup_steps=2", *overrides)
    # optax's Adam bias correction computes `float ** int32 step`, which strict promotion refuses
    with jax.numpy_dtype_promotion("standard"):
        return train(run_config(cfg), run_dir, jax.devices())


def _memory_kinds(tree):
    return {x.sharding.memory_kind for x in jax.tree.leaves(tree)}


def _assert_same_params(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb) > 0
    for x, y in zip(la, lb):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory):
    """The runs below repeat each other's initialisers and train steps: compile each once."""
    with compile_cache(tmp_path_factory.mktemp("xla_cache")):
        yield


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The plain run: 4 steps, state on device."""
    return _train(tmp_path_factory.mktemp("plain"), "train.steps=4")


@pytest.fixture(scope="module")
def offload_ckpt(tmp_path_factory):
    """An offloaded run of 2 steps that checkpoints at step 2."""
    d = tmp_path_factory.mktemp("offload")
    out = _train(d / "run", "train.steps=2", f"checkpoint.dir={d / 'ck'}", *OFFLOAD)
    return out, d / "ck"


def test_llama3_vocab_tiled_and_offloaded_losses_equal_the_plain_step(tmp_path):
    # the issue's acceptance check: the tiny model with Llama 3's vocabulary, 4 tiles and both
    # offloads against the plain step (allgather, 2 data x 4 context, 2 sequences of 256 tokens:
    # the check is per token, so the 512 adds time, not coverage; 2 steps: the second
    # step's loss already shows the first update applied)
    v = "model.vocab_size=128256"
    plain = _train(tmp_path / "plain", v, "train.steps=2")
    both = _train(tmp_path / "both", v, "train.steps=2", "memory.vocab_tiling=4", *OFFLOAD)
    assert len(plain.losses) == len(both.losses) == 2
    np.testing.assert_allclose(both.losses, plain.losses, rtol=1e-5, atol=0)
    assert plain.losses[-1] < plain.losses[0]
    assert _memory_kinds(both.params) == {"pinned_host"}
    assert _memory_kinds(plain.params) == {"device"}


def test_offloaded_state_lives_on_host_and_resumes_exactly(tmp_path, plain, offload_ckpt):
    ck = tmp_path / "ck"
    shutil.copytree(offload_ckpt[1], ck)
    first = offload_ckpt[0]
    assert _memory_kinds(first.params) == {"pinned_host"}
    assert first.losses == plain.losses[:2]  # the same arithmetic, bitwise
    second = _train(tmp_path / "run", "train.steps=4", f"checkpoint.dir={ck}", *OFFLOAD)
    assert second.start_step == 2
    assert first.losses + second.losses == plain.losses
    assert _memory_kinds(second.params) == {"pinned_host"}
    _assert_same_params(second.params, plain.params)


def test_an_offloaded_checkpoint_resumes_without_offload(tmp_path, plain, offload_ckpt):
    ck = tmp_path / "ck"
    shutil.copytree(offload_ckpt[1], ck)
    out = _train(tmp_path / "run", "train.steps=4", f"checkpoint.dir={ck}")
    assert out.start_step == 2 and out.losses == plain.losses[2:]
    assert _memory_kinds(out.params) == {"device"}
    _assert_same_params(out.params, plain.params)


def test_a_device_checkpoint_resumes_with_offload(tmp_path, plain):
    ck = tmp_path / "ck"
    _train(tmp_path / "a", "train.steps=2", f"checkpoint.dir={ck}")
    out = _train(tmp_path / "b", "train.steps=4", f"checkpoint.dir={ck}", *OFFLOAD)
    assert out.start_step == 2 and out.losses == plain.losses[2:]
    assert _memory_kinds(out.params) == {"pinned_host"}
    _assert_same_params(out.params, plain.params)
