"""Long-context tasks (lcx.evals) without a model: deterministic examples of exactly the asked
length whose answers are in their decoded prompts, RULER's scoring rules and effective length on
hand-made values, the reports' CSV and heat map, and the refusals."""

from __future__ import annotations

import collections
import csv
import re

import numpy as np
import pytest

from lcx.data.tokenizers import ByteTokenizer, stdlib_bpe
from lcx.evals import TASKS, effective_length, get_task, match_all, match_part, mean_by_length, score
from lcx.evals.prompt import MIN_HAYSTACK
from lcx.evals.runner import build_grid, decode_answer, resolve_generator, run_tasks
from lcx.evals.tasks import CommonWords, FrequentWords

BYTE = ByteTokenizer()
# the shortest byte lengths that hold every task (cwe: RULER's 300 common-word items)
LENGTH = {"cwe": 3000, "niah_multiquery": 800, "niah_multivalue": 800, "niah_multikey": 800}


@pytest.fixture(scope="module")
def bpe():
    return stdlib_bpe()


def _ex(name, tok=BYTE, seed=1, length=None, depth=0.5, index=0):
    return get_task(name).example(tok, seed=seed, length=length or LENGTH.get(name, 600), depth=depth, index=index)


@pytest.mark.parametrize("name", list(TASKS))
def test_examples_are_a_function_of_the_seed(name):
    a, b, c = _ex(name), _ex(name), _ex(name, seed=2)
    assert np.array_equal(a.prompt, b.prompt) and a.answers == b.answers
    assert not np.array_equal(a.prompt, c.prompt) and a.answers != c.answers
    d = _ex(name, index=1)
    assert d.answers != a.answers


@pytest.mark.parametrize("name", list(TASKS))
def test_prompts_have_exactly_the_length_in_either_tokenizer(name, bpe):
    for tok in (BYTE, bpe):
        for extra in (0, 1, 37):
            n = LENGTH.get(name, 600) + extra
            e = _ex(name, tok, length=n)
            assert e.prompt.dtype == np.int32 and e.prompt.ndim == 1
            assert e.prompt.size + e.max_new_tokens == n == e.length
            assert e.max_new_tokens == get_task(name).max_new_tokens
            assert (e.prompt[0] == tok.bos_id) == tok.add_bos  # BOS as in training (stdlib_bpe: yes)
            text = tok.decode(e.prompt)
            for a in e.answers:  # every reference is spelt out in the prompt
                assert a in text, (name, tok.name, a)


def test_needles_sit_at_their_depth_and_the_question_names_the_key():
    for name in ("passkey", "niah_single"):
        pos = []
        for depth in (0.0, 0.5, 1.0):
            e = _ex(name, length=1500, depth=depth)
            text = BYTE.decode(e.prompt)
            (value,) = e.answers
            pos.append(text.index(value) / len(text))
            assert e.depth == depth
        assert pos[0] < 0.2 and 0.35 < pos[1] < 0.65 and pos[2] > 0.8, pos
    e = _ex("niah_multikey")
    text = BYTE.decode(e.prompt)
    keys = re.findall(r"magic numbers for (\S+) is: (\d+)\.", text)
    assert len(keys) == 4 and len({k for k, _ in keys}) == 4
    queried = dict(keys)[re.search(r"numbers for (\S+) in the text above\?", text).group(1)]
    assert e.answers == (queried,)  # the distractors' values are not answers


def test_multi_value_and_multi_query_answers_are_their_keys_values():
    mv = _ex("niah_multivalue")
    found = re.findall(r"magic numbers for (\S+) is: (\d+)\.", BYTE.decode(mv.prompt))
    assert {k for k, _ in found} == {found[0][0]} and sorted(v for _, v in found) == sorted(mv.answers)
    mq = _ex("niah_multiquery")
    text = BYTE.decode(mq.prompt)
    found = dict(re.findall(r"magic numbers for (\S+) is: (\d+)\.", text))
    asked = re.search(r"numbers for (.+) in the text above\?", text).group(1).split(", ")
    assert len(asked) == 4 and tuple(found[k] for k in asked) == mq.answers


def test_variable_tracking_chain_resolves_to_the_answers():
    e = _ex("vt")
    assert e.depth is None
    text = BYTE.decode(e.prompt)
    value = re.search(r"assigned the value (\d+), directly", text).group(1)
    binds = dict(re.findall(r"VAR ([A-Z]{5}) = (VAR [A-Z]{5}|\d+)\.", text))
    assert len(binds) == 5
    resolved = set()
    for name in binds:  # follow each variable to its number, in the text's order
        v = binds[name]
        while v.startswith("VAR "):
            v = binds[v[4:]]
        if v == value:
            resolved.add(name)
    assert resolved == set(e.answers)
    order = [text.index(f"VAR {n} =") for n in e.answers]
    assert order == sorted(order)  # each assignment comes after the one it copies


def test_common_and_frequent_words_counts():
    e = _ex("cwe")
    words = BYTE.decode(e.prompt).split("most often.\n", 1)[1].split("\nQuestion:")[0].split()
    counts = collections.Counter(words)
    assert all(counts[w] == 30 for w in e.answers)
    assert set(counts.values()) == {30, 3} and len(counts) > 10
    small = CommonWords("cwe_small", common=3, freq_common=5, freq_rare=2)
    e = small.example(BYTE, seed=0, length=400, depth=0.5, index=0)
    assert e.prompt.size + e.max_new_tokens == 400 and len(e.answers) == 3
    f = _ex("fwe")
    counts = collections.Counter(BYTE.decode(f.prompt).split("most often.\n", 1)[1].split("\nQuestion:")[0].split())
    ranked = counts.most_common()
    assert tuple(w for w, _ in ranked[:3]) == f.answers and ranked[2][1] > ranked[3][1]


def test_a_length_too_short_is_refused_naming_both_numbers(bpe):
    for name in TASKS:
        with pytest.raises(ValueError, match=rf"eval length 120 is too short for task {name}: .* at least (\d+)"):
            _ex(name, length=120)
    with pytest.raises(ValueError, match=r"need at least \d+ tokens of tokenizer stdlib_bpe"):
        _ex("niah_multiquery", bpe, length=150)
    with pytest.raises(ValueError, match=r"depth 1.5 must lie in \[0, 1\]"):
        _ex("passkey", depth=1.5)
    with pytest.raises(ValueError, match="unknown eval task 'niah'"):
        get_task("niah")
    with pytest.raises(ValueError, match="freq_common > freq_rare"):
        CommonWords("bad", freq_common=3, freq_rare=3)
    # the minimum a refusal names is enough: one token more than the refusal's minimum - 1 builds
    msg = ""
    try:
        _ex("niah_single", length=200)
    except ValueError as err:
        msg = str(err)
    need = int(re.search(r"at least (\d+)", msg).group(1))
    assert _ex("niah_single", length=need).prompt.size == need - get_task("niah_single").max_new_tokens
    with pytest.raises(ValueError, match="too short"):
        _ex("niah_single", length=need - 1)
    assert MIN_HAYSTACK == 16


def test_scorers_match_ruler_on_hand_made_predictions():
    refs = ["1234567", "7654321", "ABCDE", "zebra"]
    assert match_all(" 1234567, abcde and ZEBRA.", refs) == 0.75
    assert match_all("nothing", refs) == 0.0
    assert match_all("1234567 7654321 abcde zebra", refs) == 1.0
    assert match_all("12345\x0067", ["1234567"]) == 0.0  # control characters split a match
    assert match_all("  \n1234567\t", ["1234567"]) == 1.0
    assert match_part("the answer is Paris", ["paris", "London"]) == 1.0
    assert match_part("Berlin", ["paris", "London"]) == 0.0
    assert score("abcde", ["ABCDE", "x"], "all") == 0.5 and score("abcde", ["ABCDE", "x"], "part") == 1.0
    with pytest.raises(ValueError, match="unknown scoring rule 'exact'"):
        score("a", ["a"], "exact")
    with pytest.raises(ValueError, match="at least one reference"):
        match_all("a", [])


def test_effective_length_on_hand_made_grids():
    assert effective_length({1024: 0.95, 2048: 0.9, 4096: 0.7, 8192: 0.9}) == 2048  # must stay above
    assert effective_length({4096: 0.856, 8192: 0.8559}) == 4096  # at the threshold counts
    assert effective_length({4096: 0.5, 8192: 0.99}) is None
    assert effective_length({8192: 1.0, 4096: 1.0}) == 8192  # order of the mapping does not matter
    assert effective_length({1: 0.9, 2: float("nan")}) == 1
    assert effective_length({1: 0.6, 2: 0.5}, threshold=0.5) == 2
    with pytest.raises(ValueError, match="threshold=85.6"):
        effective_length({1: 1.0}, threshold=85.6)
    rows = [
        {"task": "a", "seq_len": 512, "score": 1.0},
        {"task": "a", "seq_len": 512, "score": 0.5},  # a's two depths: 0.75
        {"task": "b", "seq_len": 512, "score": 0.25},
        {"task": "a", "seq_len": 1024, "score": 0.0},
    ]
    assert mean_by_length(rows) == {512: 0.5, 1024: 0.0}


def test_runner_scores_an_oracle_and_a_wrong_generator():
    # the generator sees the prompts of one cell and returns [rows, max_new_tokens] ids
    seen = []

    def oracle(model, prompts, *, plan, max_new_tokens, temperature=0.0, top_p=1.0, key=None):
        seen.append(len(prompts))
        out = np.full((len(prompts), max_new_tokens), ord(" "), np.int32)
        for i, p in enumerate(prompts):
            ans = examples[p.tobytes()]
            ids = BYTE.encode(" " + ", ".join(ans))
            out[i, : ids.size] = ids
        return out

    tasks, lengths = ["passkey", "niah_multivalue", "vt"], [800, 1000]
    cells = build_grid(BYTE, tasks=tasks, lengths=lengths, depths=[0.0, 1.0], samples=2, seed=3)
    examples = {e.prompt.tobytes(): e.answers for c in cells for e in c}
    rows = run_tasks(
        None, None, BYTE, tasks=tasks, lengths=lengths, depths=[0.0, 1.0], samples=2, seed=3, generate=oracle
    )
    assert [(r["task"], r["seq_len"], r["depth"]) for r in rows] == [
        ("passkey", 800, 0.0),
        ("passkey", 800, 1.0),
        ("passkey", 1000, 0.0),
        ("passkey", 1000, 1.0),
        ("niah_multivalue", 800, 0.0),
        ("niah_multivalue", 800, 1.0),
        ("niah_multivalue", 1000, 0.0),
        ("niah_multivalue", 1000, 1.0),
        ("vt", 800, None),  # no depth: one cell per length
        ("vt", 1000, None),
    ]
    assert all(r["score"] == 1.0 and r["samples"] == 2 for r in rows) and seen == [2] * 10
    assert effective_length(mean_by_length(rows)) == 1000

    def wrong(model, prompts, *, plan, max_new_tokens, **kw):
        return np.full((len(prompts), max_new_tokens), ord("x"), np.int32)

    rows = run_tasks(
        None, None, BYTE, tasks=["passkey"], lengths=[800], depths=[0.5], samples=3, seed=0, generate=wrong
    )
    assert rows[0]["score"] == 0.0 and rows[0]["predictions"] == ["x" * 15] * 3
    assert effective_length(mean_by_length(rows)) is None

    def short(model, prompts, *, plan, max_new_tokens, **kw):
        return np.zeros((len(prompts), max_new_tokens - 1), np.int32)

    with pytest.raises(ValueError, match=r"returned shape \(1, 14\), expected \(1, 15\)"):
        run_tasks(None, None, BYTE, tasks=["passkey"], lengths=[800], depths=[0.5], samples=1, seed=0, generate=short)


def test_generation_stops_at_eos(bpe):
    assert bpe.eos_id is not None
    ids = np.concatenate([bpe.encode(" 1234567"), [bpe.eos_id], bpe.encode(" 7654321")])
    assert decode_answer(bpe, ids) == " 1234567"
    assert decode_answer(BYTE, BYTE.encode("abc")) == "abc"


def test_a_missing_generator_is_refused_before_generating():
    with pytest.raises(ValueError, match=r"eval.generator='lcx.nosuch:generate': cannot import lcx.nosuch"):
        resolve_generator("lcx.nosuch:generate")
    with pytest.raises(ValueError, match="write module:function"):
        resolve_generator("lcx.evals")
    with pytest.raises(ValueError, match="has no function 'nope'"):
        resolve_generator("lcx.evals:nope")
    assert resolve_generator("lcx.evals.scoring:score") is score
    with pytest.raises(ValueError, match="too short"):  # the grid is refused before the generator is looked up
        run_tasks(None, None, BYTE, tasks=["vt"], lengths=[100], depths=[0.5], samples=1, seed=0, generate="x:y")


def test_report_csv_and_heatmap(tmp_path):
    from lcx.reports.ruler import heatmap_grid, write_csv, write_heatmap

    rows = [
        {"task": "niah_single", "seq_len": 512, "depth": 0.0, "samples": 2, "score": 1.0, "max_new_tokens": 17},
        {"task": "passkey", "seq_len": 512, "depth": 0.0, "samples": 2, "score": 0.5, "max_new_tokens": 15},
        {"task": "niah_single", "seq_len": 1024, "depth": 1.0, "samples": 2, "score": 0.25, "max_new_tokens": 17},
        {"task": "vt", "seq_len": 1024, "depth": None, "samples": 2, "score": 0.5, "max_new_tokens": 43},
    ]
    labels, lengths, v = heatmap_grid(rows)
    assert labels == ["depth 0", "depth 1", "vt"] and lengths == [512, 1024]
    np.testing.assert_array_equal(v, [[0.75, np.nan], [np.nan, 0.25], [np.nan, 0.5]])
    write_csv(rows, tmp_path / "r.csv")
    back = list(csv.DictReader(open(tmp_path / "r.csv")))
    assert back[3] == {
        "task": "vt",
        "seq_len": "1024",
        "depth": "",
        "samples": "2",
        "score": "0.5",
        "max_new_tokens": "43",
    }
    assert write_heatmap(rows, tmp_path / "h.png", title="t") == "matplotlib"
    assert (tmp_path / "h.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_presets_compose_and_refuse_bad_values():
    from hydra import compose, initialize_config_module

    from lcx.config import eval_query

    def q(*o):
        with initialize_config_module(config_module="lcx.conf", version_base="1.3"):
            return eval_query(compose(config_name="eval_config", overrides=["checkpoint.dir=/x", *o])).eval

    assert q().task == "passkey" and q().name == "passkey"  # python -m lcx.eval checkpoint.dir=D: unchanged
    r = q("eval=ruler")
    assert r.task == "generation" and r.threshold == 0.856 and set(r.tasks) == set(TASKS) - {"passkey"}
    assert q("eval=niah").tasks == ["niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery"]
    assert q("eval=perplexity").tasks == [] and q("eval=perplexity").perplexity_docs == 8
    with pytest.raises(ValueError, match="unknown eval task 'nope'"):
        q("eval=ruler", "eval.tasks=[nope]")
    with pytest.raises(ValueError, match=r"eval.threshold=85.6: must be a fraction"):
        q("eval=ruler", "eval.threshold=85.6")
    with pytest.raises(ValueError, match="nothing to evaluate"):
        q("eval=perplexity", "eval.perplexity_docs=0")
    with pytest.raises(ValueError, match="eval.task='ruler' is unknown"):
        q("eval.task=ruler")


def test_frequent_words_refuses_a_length_it_cannot_rank():
    tiny = FrequentWords("fwe_tiny", alpha=1.01, vocab=1000)
    with pytest.raises(ValueError, match="never ranked 3 words without a tie"):
        tiny.example(BYTE, seed=0, length=250, depth=0.5, index=0)  # room for 3 words


def test_long_eval_scores_keep_their_tensorboard_group():
    from lcx.training.hooks import tensorboard_tag

    assert tensorboard_tag("long_eval/vt") == "long_eval/vt" and tensorboard_tag("long_eval/mean") == "long_eval/mean"
    assert tensorboard_tag("tokens/code") == "train/tokens/code" and tensorboard_tag("val_loss") == "val/loss"


def test_a_resume_may_change_long_eval_every():
    from lcx.training.resume import config_changes

    saved = {"train": {"lr": 1e-3, "long_eval_every": 0}}
    assert config_changes(saved, {"train": {"lr": 1e-3, "long_eval_every": 50}}, step=10) == []
    assert config_changes(saved, {"train": {"lr": 2e-3, "long_eval_every": 0}}, step=10) == ["train.lr: 0.001 -> 0.002"]
