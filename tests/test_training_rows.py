"""data=tasks: training rows in the long-context tasks' formats (lcx.evals.training_rows), drawn
from a split disjoint from every evaluation example (lcx.evals.splits); NTK-aware RoPE; RoPE
fields changed on a trained model at evaluation (eval.rope)."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from lcx.data.config import TasksData
from lcx.data.corpora import stdlib_corpus
from lcx.data.pipeline import split_documents
from lcx.data.sources import make_data
from lcx.data.tokenizers import stdlib_bpe
from lcx.evals import TASKS, get_task
from lcx.evals.haystack import word_pool
from lcx.evals.splits import corpus_documents, in_split
from lcx.evals.training_rows import (
    TRAIN_SEED_OFFSET,
    TaskBatches,
    answer_text,
    check_tasks,
    example_row,
    packed_row,
    repeat_row,
)
from lcx.models.config import check_rope_overrides
from lcx.models.presets import preset
from lcx.models.rotary import RopeConfig

FOUR = ["passkey", "niah_single", "niah_multikey", "vt"]


@pytest.fixture(scope="module")
def bpe():
    return stdlib_bpe()


def _data(**kw):
    base = dict(
        name="tasks",
        tokenizer="stdlib_bpe",
        tasks=FOUR,
        corpus_fraction=0.25,
        prompt_loss=0.0,
        eval_rows=8,
        split_seed=0,
    )
    return TasksData(**{**base, **kw})


def _material(tok, ex) -> dict[str, set[str]]:
    """The drawn pieces of an example's needles: its references, keys, values and variable names
    (distractors included)."""
    text = tok.decode(ex.prompt.tolist())
    keys = set(re.findall(r"magic numbers for ([a-z]+-[a-z]+) is: \d+\.", text))
    values = set(re.findall(r"magic numbers for [a-z]+-[a-z]+ is: (\d+)\.", text))
    values |= set(re.findall(r"The pass key is (\d+)\. Remember it", text))
    values |= set(re.findall(r"VAR [A-Z]{5} = (\d+)\.", text))
    names = set(re.findall(r"VAR ([A-Z]{5}) = ", text))
    return {"answers": set(ex.answers), "keys": keys, "numbers": values | names}


def test_eval_and_train_examples_share_no_key_value_name_or_document(bpe):
    """Every key, value and variable name of 40 training examples per task (the seeds data=tasks
    uses) is absent from 40 evaluation examples per task at the eval seeds of lcx.eval, and the
    haystack documents of the two splits are the corpus's validation and training documents."""
    pool = {
        "eval": {"answers": set(), "keys": set(), "numbers": set()},
        "train": {"answers": set(), "keys": set(), "numbers": set()},
    }
    for name in FOUR:
        for split, seed in (("eval", 1), ("train", TRAIN_SEED_OFFSET)):
            for i in range(40):
                ex = get_task(name).example(bpe, seed=seed, length=512, depth=(i % 5) / 4, index=i, split=split)
                for k, v in _material(bpe, ex).items():
                    pool[split][k] |= v
                assert all(in_split(a, split) for a in ex.answers)
    for k in ("answers", "keys", "numbers"):
        assert pool["eval"][k] and pool["train"][k], k
        assert not pool["eval"][k] & pool["train"][k], k
    # keys drawn as word pairs: every word of the pair is of the split
    assert all(in_split(w, "eval") for key in pool["eval"]["keys"] for w in key.split("-"))
    assert set(word_pool("eval")).isdisjoint(word_pool("train"))
    assert set(word_pool("eval")) | set(word_pool("train")) == set(word_pool())
    corpus = stdlib_corpus()
    train, val = split_documents(len(corpus), 0.02, 0)
    assert set(corpus_documents("eval")) == {int(i) for i in val if corpus[int(i)]}
    assert set(corpus_documents("train")) == {int(i) for i in train if corpus[int(i)]}


def test_an_eval_haystack_is_held_out_text(bpe):
    """The text between the needles of an evaluation prompt is a piece of the validation documents."""
    corpus = stdlib_corpus()
    val_text = "\n\n".join(corpus[i] for i in corpus_documents("eval"))
    ex = get_task("passkey").example(bpe, seed=3, length=1024, depth=1.0, index=0)
    text = bpe.decode(ex.prompt.tolist())
    hay = text.split("Find it and memorize it.\n", 1)[1].split("\nThe pass key is", 1)[0]
    piece = max(hay.split("\n\n"), key=len)[:200]
    assert len(piece) > 50 and piece in val_text


def test_a_task_row_is_the_prompt_then_the_answer_with_loss_on_the_answer_only(bpe):
    for name in FOUR:
        ex = get_task(name).example(bpe, seed=5, length=256, depth=0.3, index=2, split="train")
        row = example_row(bpe, ex, 256)
        assert {k: v.shape for k, v in row.items()} == dict.fromkeys(row, (256,))
        m = row["loss_mask"] > 0
        assert bpe.decode(row["targets"][m].tolist()) == answer_text(ex) + "<|eos|>"
        n = int((row["segment_ids"] > 0).sum())
        assert np.array_equal(row["tokens"][: ex.prompt.size], ex.prompt)  # the prompt, unchanged
        assert np.array_equal(row["tokens"][1:n], row["targets"][: n - 1])  # next-token targets
        assert (row["segment_ids"][n:] == -1).all() and not m[n:].any()  # padding, no loss
        assert m.sum() == len(bpe.encode(answer_text(ex))) + 1
        weighted = example_row(bpe, ex, 256, prompt_loss=0.25)["loss_mask"]
        assert (weighted[: ex.prompt.size - 1] == 0.25).all() and np.array_equal(
            weighted[ex.prompt.size - 1 :], row["loss_mask"][ex.prompt.size - 1 :]
        )


def test_packed_rows_hold_each_example_as_its_own_document(bpe):
    exs = [
        get_task("passkey").example(bpe, seed=1, length=100, depth=0.5, index=0, split="train"),
        get_task("niah_single").example(bpe, seed=1, length=150, depth=0.2, index=1, split="train"),
    ]
    row = packed_row(bpe, exs, 256, prompt_loss=0.5)
    at = 0
    for seg, ex in enumerate(exs, start=1):
        idx = np.flatnonzero(row["segment_ids"] == seg)
        assert idx[0] == at and np.array_equal(row["positions"][idx], np.arange(idx.size))  # positions restart
        assert np.array_equal(row["tokens"][idx][: ex.prompt.size], ex.prompt)
        full = row["loss_mask"][idx] == 1.0
        assert bpe.decode(row["targets"][idx][full].tolist()) == answer_text(ex) + "<|eos|>"
        assert (row["loss_mask"][idx][: ex.prompt.size - 1] == 0.5).all()
        at = idx[-1] + 1
    assert (row["segment_ids"][at:] == -1).all() and not row["loss_mask"][at:].any()
    with pytest.raises(ValueError, match=r"lengths \[100, 150, 100\] \(sum 350\) overflow a row of 256"):
        packed_row(bpe, [*exs, exs[0]], 256)


def test_min_length_packs_shorter_examples_and_is_deterministic(bpe):
    kw = dict(seq_len=256, global_batch=16, tokenizer=bpe, tasks=("passkey", "niah_single"), corpus_fraction=0.0)
    packed = TaskBatches(**kw, min_length=92)
    b = next(packed)
    docs = b["segment_ids"].max(axis=1)
    assert (docs >= 1).all() and (docs >= 2).any()  # some rows hold two examples or more
    answers = [(r == 1.0).sum() for r in b["loss_mask"]]
    assert sum(answers) > sum((r == 1.0).sum() for r in next(TaskBatches(**kw))["loss_mask"])
    again = next(TaskBatches(**kw, min_length=92))
    assert all(np.array_equal(b[k], again[k]) for k in b)
    with pytest.raises(ValueError, match=r"data.min_length=300 must lie in \[1, train.seq_len=256\]"):
        check_tasks(bpe, FOUR, 256, 0.5, 0.0, 300)


def test_a_repeat_row_scores_only_copies_of_earlier_spans(bpe):
    for seed in range(20):
        row = repeat_row(bpe, np.random.default_rng(seed), 256)
        scored = np.flatnonzero(row["loss_mask"])
        assert scored.size >= 7 and set(np.unique(row["loss_mask"])) <= {0.0, 1.0}
        doc = np.concatenate([row["tokens"], row["targets"][-1:]])
        for run in np.split(scored, np.flatnonzero(np.diff(scored) > 1) + 1):
            span = doc[run[0] : run[-1] + 2]  # the repeat: its first token and the scored ones
            earlier = [i for i in range(run[0] - span.size + 1) if np.array_equal(doc[i : i + span.size], span)]
            assert earlier, f"seed {seed}: the scored span at {run[0]} copies nothing earlier"
    mixed = TaskBatches(
        seq_len=256, global_batch=16, tokenizer=bpe, tasks=("passkey",), corpus_fraction=0.0, repeat_fraction=0.5
    )
    b = next(mixed)
    ends = [t[np.flatnonzero(m)[-1]] for t, m in zip(b["targets"], b["loss_mask"], strict=True)]
    n_task = sum(1 for e in ends if e == bpe.eos_id)  # a task row's scored targets end with the EOS
    assert 0 < n_task < 16
    with pytest.raises(ValueError, match=r"data.repeat_fraction=0.8 must lie in \[0, 1 - data.corpus_fraction=0.5\]"):
        check_tasks(bpe, FOUR, 256, 0.5, 0.0, None, 0.8)


def test_the_stream_mixes_tasks_and_corpus_and_resumes_exactly(bpe):
    data = make_data(_data(), seq_len=256, global_batch=16, layout="zigzag", context_degree=4)
    assert isinstance(data.train, TaskBatches)
    a = [next(data.train) for _ in range(3)]
    state = data.train.state()
    nxt = next(data.train)
    again = make_data(_data(), seq_len=256, global_batch=16, layout="zigzag", context_degree=4).train
    again.restore(state)
    assert all(np.array_equal(nxt[k], v) for k, v in next(again).items())
    plain = make_data(_data(), seq_len=256, global_batch=16).train
    b = next(plain)
    full = b["loss_mask"].sum(axis=1) == 256  # corpus rows: loss on every token
    assert 0 < full.sum() < 16
    assert not np.array_equal(a[0]["tokens"], a[1]["tokens"])
    with pytest.raises(ValueError, match="seed"):
        make_data(_data(), seq_len=256, global_batch=16, seed=1).train.restore(state)
    assert len(data.val) == 1 and data.val.unigram_entropy() > 0


def test_a_length_or_mix_that_cannot_be_built_is_refused_before_compiling(bpe):
    with pytest.raises(ValueError, match=r"train.seq_len=128.*niah_multikey|niah_multikey.*train.seq_len=128"):
        check_tasks(bpe, ["niah_multikey"], 128, 0.5)
    with pytest.raises(ValueError, match="unknown eval task 'nope'"):
        check_tasks(bpe, ["nope"], 256, 0.5)
    with pytest.raises(ValueError, match=r"corpus_fraction=1.5"):
        check_tasks(bpe, FOUR, 256, 1.5)
    with pytest.raises(ValueError, match=r"data.prompt_loss=2"):
        check_tasks(bpe, FOUR, 256, 0.5, 2.0)
    with pytest.raises(ValueError, match="data.tasks is empty"):
        check_tasks(bpe, [], 256, 0.5)
    check_tasks(bpe, [], 256, 1.0)  # corpus only


def test_ntk_aware_rope_is_plain_rope_with_a_larger_base():
    r = RopeConfig(head_dim=32, theta=10000.0, scaling_type="ntk", factor=4.0)
    plain = RopeConfig(head_dim=32, theta=10000.0 * 4.0 ** (32 / 30))
    assert np.array_equal(r.frequencies(), plain.frequencies())
    base = RopeConfig(head_dim=32, theta=10000.0).frequencies()
    assert r.frequencies()[0] == base[0]  # the fastest pair is kept
    assert np.isclose(base[-1] / r.frequencies()[-1], 4.0, rtol=1e-12)  # the slowest stretched by s
    assert r.attention_scaling == 1.0


def test_ntk_export_is_refused_with_the_equivalent_plain_base():
    from lcx.models.hf_export import to_hf_config

    cfg = dataclasses.replace(preset("tiny"), rope_scaling_type="ntk", rope_scaling_factor=4.0)
    with pytest.raises(ValueError, match=r"model.rope_scaling_type=null .*model.rope_theta=4\d{4}"):
        to_hf_config(cfg, torch_dtype="float32")


def test_only_rope_fields_can_be_changed_on_a_trained_model():
    check_rope_overrides({"rope_scaling_type": "yarn", "rope_scaling_factor": 4.0}, where="eval.rope")
    check_rope_overrides(None, where="eval.rope")
    with pytest.raises(ValueError, match=r"eval.rope.n_layers: only the model's RoPE fields.*rope_theta"):
        check_rope_overrides({"n_layers": 3}, where="eval.rope")
    with pytest.raises(ValueError, match="must be null or a mapping"):
        check_rope_overrides([1], where="eval.rope")


@pytest.mark.parametrize("name", list(TASKS))
def test_every_task_draws_its_answers_from_the_split_asked(name, bpe):
    length = 3000 if name == "cwe" else 1024
    for split in ("eval", "train"):
        ex = get_task(name).example(bpe, seed=0, length=length, depth=0.5, index=0, split=split)
        assert ex.prompt.size + ex.max_new_tokens == length
        assert ex.answers and all(in_split(a, split) for a in ex.answers)
    with pytest.raises(ValueError, match="unknown task split 'test'"):
        get_task(name).example(bpe, seed=0, length=length, depth=0.5, index=0, split="test")
