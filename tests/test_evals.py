"""Long-context tasks (lcx.evals) without a model: deterministic examples of exactly the asked
length whose answers are in their decoded prompts, RULER's scoring rules and effective length on
hand-made values, tasks that do not fit a length left out (not refused) with their reason, the
reports' CSV, heat map and summary, and the refusals."""

from __future__ import annotations

import collections
import csv
import re

import numpy as np
import pytest

from lcx.data.tokenizers import ByteTokenizer, stdlib_bpe
from lcx.evals import (
    TASKS,
    LengthTooShort,
    effective_length,
    fit_grid,
    get_task,
    match_all,
    match_part,
    mean_by_length,
    ruler_score,
    score,
    string_match_all,
    string_match_part,
)
from lcx.evals.prompt import MIN_HAYSTACK
from lcx.evals.runner import (
    build_grid,
    complete_lengths,
    decode_answer,
    mean_by_task,
    resolve_generator,
    run_tasks,
    tasks_by_length,
)
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


# RULER's reference, verbatim but for formatting (github.com/NVIDIA/RULER, Apache-2.0):
# scripts/eval/evaluate.py's postprocess_pred and scripts/eval/synthetic/constants.py's metrics.
def _ruler_postprocess_pred(predict_str):
    predict_str = predict_str.strip()
    np_pattern = re.compile(r"[\x00-\x1f]")
    predict_str = np_pattern.sub("\n", predict_str).strip()
    return predict_str


def _ruler_string_match_part(preds, refs):
    score = (
        sum([max([1.0 if r.lower() in pred.lower() else 0.0 for r in ref]) for pred, ref in zip(preds, refs)])
        / len(preds)
        * 100
    )
    return round(score, 2)


def _ruler_string_match_all(preds, refs):
    score = (
        sum(
            [sum([1.0 if r.lower() in pred.lower() else 0.0 for r in ref]) / len(ref) for pred, ref in zip(preds, refs)]
        )
        / len(preds)
        * 100
    )
    return round(score, 2)


# (prediction, references, string_match_all's per-sample value, string_match_part's), each
# worked out by hand from RULER's rules
RULER_PAIRS = [
    # case: both sides lower-cased
    ("The Special Magic Number Is 1234567 AND abcde", ["1234567", "ABCDE"], 1.0, 1.0),
    # str.lower, not casefold: "Straße".lower() is "straße", which "strasse" does not contain
    ("STRASSE", ["Straße"], 0.0, 0.0),
    # substrings, not words: "123" is in "41235"; "12345678" is not in "1234567"
    ("41235", ["123"], 1.0, 1.0),
    ("1234567", ["12345678"], 0.0, 0.0),
    # control characters become line breaks, then the ends are stripped: "\x00\t 7654321\x1f\n"
    # is "7654321"; "12345\x0067" is "12345\n67", which holds neither "1234567" nor "12345 67"
    ("\x00\t 7654321\x1f\n", ["7654321"], 1.0, 1.0),
    ("12345\x0067", ["1234567", "12345 67"], 0.0, 0.0),
    # a tab is a line break after cleaning, so a reference with "\n" in it matches; DEL (\x7f) and
    # the space are not C0 control characters and stay
    ("ab\tcd", ["ab\ncd"], 1.0, 1.0),
    ("x\x7fy z", ["x\x7fy", "xy"], 0.5, 1.0),
    # partial credit: 3 of 4 needles, then 1 of 3 variables
    ("1111111, 2222222 and 4444444", ["1111111", "2222222", "3333333", "4444444"], 0.75, 1.0),
    ("VAR QWERT = 12", ["QWERT", "ASDFG", "ZXCVB"], 1 / 3, 1.0),
    ("nothing here", ["1111111"], 0.0, 0.0),
]


def test_scoring_is_rulers_reference_on_fixed_pairs():
    """lcx.evals.scoring against RULER's definition (github.com/NVIDIA/RULER,
    scripts/eval/synthetic/constants.py: string_match_all, string_match_part; scripts/eval/
    evaluate.py: postprocess_pred): per sample the fraction of references found (all) or 1 if
    any is found (part), as case-insensitive substrings of the prediction stripped after every
    C0 control character became a line break; per task the mean over samples as a percentage
    rounded to 2 decimals. The expected values are worked out by hand; RULER's own code, copied
    above, must agree with them and with lcx."""
    from lcx.evals.scoring import clean

    for pred, refs, want_all, want_part in RULER_PAIRS:
        assert match_all(pred, refs) == want_all, (pred, refs)
        assert match_part(pred, refs) == want_part, (pred, refs)
        assert clean(pred) == _ruler_postprocess_pred(pred)
        cleaned = _ruler_postprocess_pred(pred)
        assert (
            _ruler_string_match_all([cleaned], [refs]) == round(want_all * 100, 2) == string_match_all([pred], [refs])
        )
        assert (
            _ruler_string_match_part([cleaned], [refs])
            == round(want_part * 100, 2)
            == string_match_part([pred], [refs])
        )
    assert clean("\x00\t 7654321\x1f\n") == "7654321" and clean(" a\x01b\rc ") == "a\nb\nc"
    assert clean("\u00a0 42\u3000") == "42"  # Python's strip: every Unicode white space, as RULER's
    preds, refs = [p for p, *_ in RULER_PAIRS], [r for _, r, *_ in RULER_PAIRS]
    # all: (1 + 0 + 1 + 0 + 1 + 0 + 1 + 0.5 + 0.75 + 1/3 + 0) / 11 * 100 = 5.5833.. / 11 * 100 = 50.757..
    assert string_match_all(preds, refs) == 50.76
    # part: 7 of 11 samples find a reference: 63.6363.. -> 63.64
    assert string_match_part(preds, refs) == 63.64
    cleaned = [_ruler_postprocess_pred(p) for p in preds]
    assert _ruler_string_match_all(cleaned, refs) == 50.76 and _ruler_string_match_part(cleaned, refs) == 63.64
    # the 2-decimal rounding is Python's round, as RULER's: 1 of 3 -> 33.33, 2 of 3 -> 66.67, and
    # 1 of 32 = 3.125 exactly in binary, which rounds half to even: 3.12
    assert ruler_score([1.0, 0.0, 0.0]) == 33.33 and ruler_score([1.0, 1.0, 0.0]) == 66.67
    assert ruler_score([1.0] + [0.0] * 31) == 3.12 == _ruler_string_match_all(["a"] + ["b"] * 31, [["a"]] * 32)
    assert ruler_score([0.75, 1 / 3, 0.0]) == 36.11  # (0.75 + 0.333..) / 3 * 100 = 36.111..
    with pytest.raises(ValueError, match="3 predictions for 2 reference lists"):
        string_match_all(["a", "b", "c"], [["a"], ["b"]])
    with pytest.raises(ValueError, match="at least one sample"):
        ruler_score([])


def test_effective_length_is_rulers_longest_length_above_the_threshold():
    # RULER's rule: the longest length whose score exceeds 85.6 (README: "exceeding ... Llama-2-7b
    # performance at 4K (85.6%)"; Llama-2-7B, at 85.6, has none). Until issue 48, lcx stopped at
    # the first failing length and counted a score equal to the threshold.
    assert effective_length({1024: 95.0, 2048: 90.0, 4096: 70.0, 8192: 90.0}) == 8192
    assert effective_length({4096: 85.6, 8192: 85.59}) is None  # equal is not above
    assert effective_length({4096: 85.61, 8192: 85.6}) == 4096
    assert effective_length({4096: 50.0, 8192: 99.0}) == 8192
    assert effective_length({8192: 100.0, 4096: 100.0}) == 8192  # order of the mapping does not matter
    assert effective_length({1: 90.0, 2: float("nan")}) == 1
    assert effective_length({1: 60.0, 2: 50.0}, threshold=50.0) == 1
    with pytest.raises(ValueError, match=r"threshold=0.856: must be a percentage in \(1, 100\].*write 85.6"):
        effective_length({1: 100.0}, threshold=0.856)
    with pytest.raises(ValueError, match="at least one evaluated length"):
        effective_length({})


def _row(task, length, scores, depth=None):
    return {"task": task, "seq_len": length, "depth": depth, "score": ruler_score(scores), "sample_scores": scores}


def test_task_scores_pool_their_samples_and_lengths_average_their_tasks():
    rows = [
        _row("a", 512, [1.0, 1.0, 0.0], 0.0),  # 66.67
        _row("a", 512, [0.0, 0.0, 1.0], 1.0),  # 33.33; a at 512: 3 of 6 samples, 50.0
        _row("b", 512, [0.25, 0.25, 0.25]),
        _row("a", 1024, [0.0, 0.0, 0.0], 0.0),
        {"task": "b", "seq_len": 1024, "depth": None, "score": None, "reason": "too short"},  # not run
    ]
    assert [r["score"] for r in rows[:3]] == [66.67, 33.33, 25.0]
    assert mean_by_task(rows) == {"a": {512: 50.0, 1024: 0.0}, "b": {512: 25.0}}
    assert mean_by_length(rows) == {512: 37.5, 1024: 0.0}  # 1024: a alone
    assert tasks_by_length(rows) == {512: ["a", "b"], 1024: ["a"]}
    assert complete_lengths(rows, ["a", "b"]) == [512]
    # the mean over tasks is rounded to 2 decimals, as each task's score is
    three = [_row("a", 1, [1.0]), _row("b", 1, [1.0]), _row("c", 1, [0.0])]
    assert mean_by_length(three) == {1: 66.67}


def test_a_task_that_does_not_fit_a_length_is_left_out_with_its_reason():
    cells, skipped = fit_grid(BYTE, tasks=["passkey", "cwe"], lengths=[800, 3000], depths=[0.0, 1.0], samples=2, seed=0)
    assert [(c[0].task, c[0].length, c[0].depth, len(c)) for c in cells] == [
        ("passkey", 800, 0.0, 2),
        ("passkey", 800, 1.0, 2),
        ("passkey", 3000, 0.0, 2),
        ("passkey", 3000, 1.0, 2),
        ("cwe", 3000, None, 2),
    ]
    (r,) = skipped
    assert (r["task"], r["seq_len"], r["depth"], r["samples"], r["score"]) == ("cwe", 800, None, 0, None)
    assert re.match(r"eval length 800 is too short for task cwe: .* at least (\d+) tokens", r["reason"])
    assert 800 < r["need"] <= 3000 and f"at least {r['need']} tokens" in r["reason"]
    # a depth task not run leaves one row per depth it would have had
    _, skipped = fit_grid(BYTE, tasks=["niah_single"], lengths=[300], depths=[0.0, 0.5], samples=1, seed=0)
    assert [(r["task"], r["depth"]) for r in skipped] == [("niah_single", 0.0), ("niah_single", 0.5)]
    # build_grid, for the training hook and run_tasks, still refuses; the refusal is a ValueError
    with pytest.raises(LengthTooShort, match="eval length 800 is too short for task cwe") as err:
        build_grid(BYTE, tasks=["passkey", "cwe"], lengths=[800], depths=[0.5], samples=1, seed=0)
    assert isinstance(err.value, ValueError) and err.value.length == 800 and err.value.task == "cwe"
    with pytest.raises(ValueError, match=r"depth 1.5 must lie in \[0, 1\]"):  # other errors are not skipped
        fit_grid(BYTE, tasks=["passkey"], lengths=[800], depths=[1.5], samples=1, seed=0)


def test_rulers_default_lengths_of_the_readme_checkpoint_run_what_fits():
    # python -m lcx.train (byte tokens, train.seq_len 4096), then eval=ruler with no other key:
    # lengths 2048, 4096 and 8192; cwe does not fit 2048 and is left out there, never refused
    from lcx.reports.ruler import summarize

    tasks = ["niah_single", "vt", "cwe"]
    cells, skipped = fit_grid(BYTE, tasks=tasks, lengths=[2048, 4096], depths=[0.5], samples=1, seed=1)
    assert {(r["task"], r["seq_len"]) for r in skipped} == {("cwe", 2048)}
    rows = [_row(c[0].task, c[0].length, [1.0], c[0].depth) for c in cells] + skipped
    rep = summarize(rows, tasks, 85.6)
    assert rep["tasks_by_length"] == {"2048": ["niah_single", "vt"], "4096": ["niah_single", "vt", "cwe"]}
    assert rep["complete_lengths"] == [4096] and rep["effective_length"] == 4096
    assert rep["mean_by_length"] == {"2048": 100.0, "4096": 100.0}
    # a length where a task was left out never counts towards the effective length
    rows = [r if r["seq_len"] == 2048 else {**r, "score": 0.0, "sample_scores": [0.0]} for r in rows]
    rep = summarize(rows, tasks, 85.6)
    assert rep["mean_by_length"]["2048"] == 100.0 and rep["effective_length"] is None


def test_a_length_asked_for_that_fits_no_task_is_refused_naming_the_numbers():
    from lcx.reports.ruler import refuse_unfit_lengths

    tasks = ["niah_single", "vt"]
    cells, skipped = fit_grid(BYTE, tasks=tasks, lengths=[200, 1000], depths=[0.5], samples=1, seed=1)
    need = {r["task"]: r["need"] for r in skipped}
    with pytest.raises(ValueError) as err:
        refuse_unfit_lengths(skipped, cells, [200, 1000], "byte")
    assert str(err.value) == (
        f"eval.lengths=[200, 1000]: 200 tokens fit none of eval.tasks (at 200, tokenizer byte: niah_single at "
        f"least {need['niah_single']}, vt at least {need['vt']}); drop it or use lengths >= {min(need.values())}"
    )
    refuse_unfit_lengths([], cells, [1000], "byte")  # every length fits some task: no refusal
    cells, skipped = fit_grid(BYTE, tasks=["niah_single", "cwe"], lengths=[1000], depths=[0.5], samples=1, seed=1)
    refuse_unfit_lengths(skipped, cells, [1000], "byte")  # cwe is left out at 1000, niah_single runs


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
    assert all(r["score"] == 100.0 and r["samples"] == 2 for r in rows) and seen == [2] * 10
    assert all(r["sample_scores"] == [1.0, 1.0] and r["reason"] is None and r["out_of_vocab"] == 0 for r in rows)
    assert effective_length(mean_by_length(rows)) == 1000

    def wrong(model, prompts, *, plan, max_new_tokens, **kw):
        return np.full((len(prompts), max_new_tokens), ord("x"), np.int32)

    rows = run_tasks(
        None, None, BYTE, tasks=["passkey"], lengths=[800], depths=[0.5], samples=3, seed=0, generate=wrong
    )
    assert rows[0]["score"] == 0.0 and rows[0]["predictions"] == ["x" * 15] * 3
    assert rows[0]["sample_scores"] == [0.0] * 3
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
    # ids past the tokenizer's vocabulary (a model's padded rows) have no text: left out, as Hugging
    # Face tokenizers' decode leaves them out, and counted; after EOS nothing counts
    from lcx.evals.runner import out_of_vocab

    ids = np.concatenate([BYTE.encode("abc"), [256, 300], BYTE.encode("d")])
    assert decode_answer(BYTE, ids) == "abcd" and out_of_vocab(BYTE, ids) == 2
    ids = np.concatenate([bpe.encode(" 1234567"), [bpe.vocab_size], [bpe.eos_id], [bpe.vocab_size + 1]])
    assert decode_answer(bpe, ids) == " 1234567" and out_of_vocab(bpe, ids) == 1


def test_a_missing_generator_is_refused_before_generating():
    with pytest.raises(ValueError, match=r"eval.generator='lcx.nosuch:generate': cannot import lcx.nosuch"):
        resolve_generator("lcx.nosuch:generate")
    with pytest.raises(ValueError, match="write module:function"):
        resolve_generator("lcx.evals")
    with pytest.raises(ValueError, match="has no function 'nope'"):
        resolve_generator("lcx.evals:nope")
    assert resolve_generator("lcx.evals.scoring:score") is score
    with pytest.raises(LengthTooShort, match="too short"):  # the grid is refused before the generator is looked up
        run_tasks(None, None, BYTE, tasks=["vt"], lengths=[100], depths=[0.5], samples=1, seed=0, generate="x:y")


def test_report_csv_and_heatmap(tmp_path):
    from lcx.reports.ruler import heatmap_grid, write_csv, write_heatmap

    rows = [
        {"task": "niah_single", "seq_len": 512, "depth": 0.0, "samples": 2, "score": 100.0, "max_new_tokens": 17},
        {"task": "passkey", "seq_len": 512, "depth": 0.0, "samples": 2, "score": 50.0, "max_new_tokens": 15},
        {"task": "niah_single", "seq_len": 1024, "depth": 1.0, "samples": 2, "score": 25.0, "max_new_tokens": 17},
        {"task": "vt", "seq_len": 1024, "depth": None, "samples": 2, "score": 50.0, "max_new_tokens": 43},
        {
            "task": "cwe",
            "seq_len": 512,
            "depth": None,
            "samples": 0,
            "score": None,
            "max_new_tokens": 128,
            "reason": "eval length 512 is too short for task cwe",
            "need": 2450,
        },
    ]
    labels, lengths, v = heatmap_grid(rows)
    assert labels == ["depth 0", "depth 1", "cwe", "vt"] and lengths == [512, 1024]
    np.testing.assert_array_equal(v, [[75.0, np.nan], [np.nan, 25.0], [np.nan, np.nan], [np.nan, 50.0]])
    write_csv(rows, tmp_path / "r.csv")
    back = list(csv.DictReader(open(tmp_path / "r.csv")))
    assert back[3] == {
        "task": "vt",
        "seq_len": "1024",
        "depth": "",
        "samples": "2",
        "score": "50.0",
        "max_new_tokens": "43",
        "reason": "",
    }
    assert back[4]["score"] == "" and back[4]["samples"] == "0" and back[4]["reason"] == rows[4]["reason"]
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
    assert r.task == "generation" and r.threshold == 85.6 and set(r.tasks) == set(TASKS) - {"passkey"}
    assert q("eval=niah").tasks == ["niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery"]
    assert q("eval=perplexity").tasks == [] and q("eval=perplexity").perplexity_docs == 8
    with pytest.raises(ValueError, match="unknown eval task 'nope'"):
        q("eval=ruler", "eval.tasks=[nope]")
    # scores are RULER's percentages since issue 48: a fraction threshold is named as one
    with pytest.raises(ValueError, match=r"eval.threshold=0.856: must be a percentage in \(1, 100\]"):
        q("eval=ruler", "eval.threshold=0.856")
    with pytest.raises(ValueError, match=r"eval.threshold=101.0: must be a percentage"):
        q("eval=ruler", "eval.threshold=101.0")
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


def test_the_teacher_forced_passkey_refuses_a_checkpoint_of_another_tokenizer():
    from lcx.reports.passkey import check_byte_level

    check_byte_level({"data": {"tokenizer": "byte"}}, "c")
    check_byte_level({}, "c")  # no data section: byte, as lcx.train's default
    with pytest.raises(ValueError, match=r"tokenizer='stdlib_bpe'.*eval=ruler eval.tasks=\[passkey\] checkpoint.dir=c"):
        check_byte_level({"data": {"tokenizer": "stdlib_bpe"}}, "c")
