"""``python -m lcx.generate checkpoint.dir=D generate.prompts=[...] [plan=...]``: a 1-step training
checkpoint (ring plan) generates the same greedy tokens on its own plan and on another one
(``plan=allgather``), as lcx.generate.generate does on one device; bad configurations are refused
before anything compiles."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from _checkpoints import compose as _compose
from _checkpoints import train_tiny

from lcx.config import generate_query
from lcx.data.tokenizers import get_tokenizer
from lcx.generate import generate
from lcx.generate.__main__ import run_generate
from lcx.sharding import Plan, bind
from lcx.training.resume import load_model

PROMPTS = ["def main(", "import"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, devices):
    return train_tiny(tmp_path_factory.mktemp("generate"), devices, ["plan=ring"])


@pytest.mark.slow  # ~65 s on 2 cores; the floor runs the library path (test_generate.py)
def test_generate_cli_on_the_checkpoint_plan_and_another(checkpoint, tmp_path, devices):
    prompts = "[" + ",".join(f'"{p}"' for p in PROMPTS) + "]"
    base = [f"checkpoint.dir={checkpoint}", f"generate.prompts={prompts}", "generate.max_new_tokens=5"]
    own = generate_query(_compose("generate_config", base))
    assert own.plan is None and own.generate.prompts == PROMPTS and own.generate.temperature == 0.0
    other = generate_query(_compose("generate_config", [*base, "plan=allgather"]))
    assert other.plan is not None and other.plan.attention.strategy == "allgather"
    a = run_generate(own, devices, tmp_path)
    b = run_generate(other, devices)
    assert a["plan"] == "ring" and b["plan"] == "allgather"
    assert json.loads((tmp_path / "generate.json").read_text()) == a
    tokens = [r["tokens"] for r in a["results"]]
    assert tokens == [r["tokens"] for r in b["results"]] and np.shape(tokens) == (2, 5)
    # the same tokens from the library on one device
    mp = bind(Plan(mesh=(("data", 1),), activations={"batch": "data"}), devices[:1])
    model, _ = load_model(checkpoint, mp)
    tok = get_tokenizer("byte")
    ids = [np.asarray(tok.encode(p), np.int32) for p in PROMPTS]
    single = np.asarray(generate(model, ids, plan=mp, max_new_tokens=5, eos_id=tok.eos_id)).tolist()
    assert tokens == single


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ([], "lcx.generate needs a checkpoint"),
        (["checkpoint.dir=/nowhere", "generate.prompts=[]"], "generate.prompts is empty"),
        (["checkpoint.dir=/nowhere", "generate.prompts=[a]", "generate.max_new_tokens=0"], "max_new_tokens=0"),
    ],
)
def test_generate_config_refusals(overrides, match):
    with pytest.raises(ValueError, match=match):
        generate_query(_compose("generate_config", overrides))


def test_misspelt_key_is_refused_by_the_command_line(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "lcx.generate", "checkpoint.dir=x", "generate.max_new_tokns=3"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert r.returncode == 2 and "max_new_tokens" in r.stderr, r.stderr
