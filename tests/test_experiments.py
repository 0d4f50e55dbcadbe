"""Reproducible experiments: the Hydra multirun contract, the passkey data source, run_info.json,
and the experiment scripts' gathering on synthetic run directories (no training here except the
4 one-step multirun jobs)."""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
import pytest
import yaml
from _multirun import multirun, one_step_job

from lcx.data import BATCH_KEYS, ByteTokenizer, make_data
from lcx.data.passkey import (
    FILLER,
    PasskeyBatches,
    PasskeyEval,
    min_seq_len,
    passkey_example,
)
from lcx.sharding.layout import undo_layout

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "experiments"))


# ------------------------------------------------------------------ multirun: 4 jobs, one process
@pytest.mark.slow
def test_multirun_leaves_a_run_dir_per_job(tmp_path):
    """`python -m lcx.train -m plan=allgather,ring train.seq_len=...` runs 4 jobs in one process
    (Hydra's basic launcher; the first job fixes 8 devices) and each leaves its own run directory
    with metrics.jsonl and a run_info.json that names what reproduces it."""
    runs = multirun(
        tmp_path / "mr",
        "plan=allgather,ring",
        "train.seq_len=256,512",
        "train.steps=1",
        "train.eval_every=0",
        "data=passkey",
        "model.n_layers=1",
    )
    assert len(runs) == 4, runs
    seen = set()
    for d in runs:
        info = one_step_job(d)
        for k in ("lcx", "git_commit", "xla_flags", "device_kind", "device_count", "config", "command", "hydra"):
            assert k in info, k
        assert info["device_kind"]
        assert all(info["packages"][p] for p in ("jax", "jaxlib", "equinox"))
        assert info["jax_config"]["jax_num_cpu_devices"] == 8
        seen.add((info["config"]["plan"]["name"], info["config"]["train"]["seq_len"]))
        assert sorted(info["hydra"]["overrides"])[0].startswith(("data=", "hydra.", "model.", "plan=", "train."))
    assert seen == {(p, s) for p in ("allgather", "ring") for s in (256, 512)}


# ------------------------------------------------------------------ passkey data
def test_passkey_example_places_answer_and_masks_only_its_digits():
    tok = ByteTokenizer()
    for depth in (0.0, 0.37, 1.0):
        ex = passkey_example(512, "40719", depth, filler_offset=5)
        a = ex.arrays
        assert {k: v.shape for k, v in a.items()} == {k: (512,) for k in BATCH_KEYS}
        assert a["tokens"].dtype == np.int32 and a["loss_mask"].dtype == np.float32
        # targets are the next tokens of one document of S + 1 bytes
        np.testing.assert_array_equal(a["targets"][:-1], a["tokens"][1:])
        np.testing.assert_array_equal(np.flatnonzero(a["loss_mask"]), ex.answer_pos)
        assert tok.decode(a["targets"][ex.answer_pos]) == "40719"
        assert tok.decode(a["tokens"][ex.key_pos : ex.key_pos + 5]) == "40719"
        assert tok.decode(a["tokens"][ex.answer_pos[0] - 5 : ex.answer_pos[0] + 1]).endswith("is <")
        assert tok.decode(a["tokens"]).count("<") == 3  # key, its repeat, question
        np.testing.assert_array_equal(a["positions"], np.arange(512))
        assert (a["segment_ids"] == 1).all()
        # the only digits in the row are the key (twice) and the answer
        text = tok.decode(a["tokens"])
        assert sum(c.isdigit() for c in text) == 15  # tokens end with the answer (its targets end with ">")
    # depth moves the key: 0 right after the intro, 1 right before the question
    pos = [passkey_example(1024, "12345", d).key_pos for d in (0.0, 0.5, 1.0)]
    assert pos[0] < pos[1] < pos[2] and pos[0] < 120 and pos[2] > 1024 - 120


def test_passkey_recall_loss_adds_the_key_repeat_only():
    ex = passkey_example(400, "55555", 0.5, recall_loss=True)
    m = np.flatnonzero(ex.arrays["loss_mask"])
    assert len(m) == 10 and set(ex.answer_pos) <= set(m)
    assert ByteTokenizer().decode(ex.arrays["targets"][m]) == "5555555555"


def test_passkey_repeats_filler_and_loss_on_all():
    tok = ByteTokenizer()
    ex = passkey_example(600, "90817", 0.3, 42, filler="repeats", loss_on="all")
    text = tok.decode(ex.arrays["tokens"])
    assert text.count("<") == 3 and sum(c.isdigit() for c in text) == 15
    assert (ex.arrays["loss_mask"] == 1.0).all()
    again = passkey_example(600, "90817", 0.3, 42, filler="repeats", loss_on="all")
    np.testing.assert_array_equal(ex.arrays["tokens"], again.arrays["tokens"])  # seeded by the offset
    # each filler sentence is written twice in a row
    first = text[len("There is important info hidden inside a lot of irrelevant text. Find it and memorize it. ") :]
    sent = first[: first.index(". ") + 2]
    assert first.startswith(sent + sent)
    ev = PasskeyEval(seq_len=600, global_batch=2, depths=[0.5], per_depth=2, filler="repeats")
    assert ev[0]["loss_mask"].sum() == 10  # evaluation scores the answer digits only
    with pytest.raises(ValueError, match="loss_on"):
        passkey_example(600, "90817", 0.3, loss_on="some")


def test_passkey_refusals():
    with pytest.raises(ValueError, match="too short"):
        passkey_example(min_seq_len() - 1, "12345", 0.5)
    with pytest.raises(ValueError, match="depth"):
        passkey_example(512, "12345", 1.5)
    with pytest.raises(ValueError, match="digits"):
        passkey_example(512, "12a45", 0.5)


def test_passkey_batches_deterministic_resumable_and_laid_out():
    kw = dict(seq_len=256, global_batch=3, layout="zigzag", context_degree=4, seed=7)
    a, b = PasskeyBatches(**kw), PasskeyBatches(**kw)
    first = [next(a) for _ in range(3)]
    for x in first:
        y = next(b)
        for k in BATCH_KEYS:
            np.testing.assert_array_equal(x[k], y[k])
    c = PasskeyBatches(**kw, state={"epoch": 0, "row": 6, "seed": 7, "seq_len": 256, "digits": 5})
    np.testing.assert_array_equal(next(c)["tokens"], first[2]["tokens"])
    # zigzag layout applied to all five arrays together: undoing it gives the generated row
    ex = a.example(0)
    for k in BATCH_KEYS:
        np.testing.assert_array_equal(undo_layout(first[0][k], "zigzag", 4)[0], ex.arrays[k])
    assert not np.array_equal(first[0]["tokens"][0], first[0]["tokens"][1])  # different keys / depths
    with pytest.raises(ValueError, match="seed"):
        a.restore({"epoch": 0, "row": 0, "seed": 8})


def test_passkey_eval_and_make_data_dispatch():
    ev = PasskeyEval(seq_len=256, global_batch=4, depths=[0.0, 1.0], per_depth=3)
    assert len(ev.examples) == 6 and len(ev) == 2
    last = ev[1]
    assert last["loss_mask"][2:].sum() == 0 and last["loss_mask"][:2].sum() == 10  # padding rows carry no loss
    assert [e.depth for e in ev.examples] == [0.0] * 3 + [1.0] * 3
    from lcx.config.run import data_config

    passkey = yaml.safe_load((ROOT / "conf" / "data" / "passkey.yaml").read_text())
    d = make_data(
        data_config({**passkey, "digits": 5, "eval_depths": [0.5], "eval_per_depth": 2}),
        seq_len=256,
        global_batch=2,
        layout="zigzag",
        context_degree=2,
        seed=0,
    )
    assert next(d.train)["tokens"].shape == (2, 256) and len(list(d.val_batches())) == 1
    assert FILLER.count("<") == 0 and not any(ch.isdigit() for ch in FILLER)


# ------------------------------------------------------------------ gathering scripts on synthetic runs
def _fake_run(d: pathlib.Path, plan: str, seq: int, losses, temp=2**20 * 10, tps=1000.0):
    d.mkdir(parents=True)
    cfg = {
        "plan": {"name": plan, "attention": {"strategy": plan}, "mesh": {"data": 2, "context": 4}},
        "train": {"seq_len": seq, "global_batch": 2},
    }
    info = {"git_commit": "0123456789abcdef", "git_dirty": [], "python": "3.11.7", "packages": {"jax": "0.10.2"}}
    (d / "run_info.json").write_text(json.dumps({"config": cfg, "mesh": {"data": 2, "context": 4}, **info}))
    lines = []
    for i, l in enumerate(losses, 1):
        rec = {"step": i, "loss": l, "tokens_per_sec": tps * (0.5 if i == 1 else 1.0), "mfu": 0.1, "step_time_s": 1.0}
        if i == 1:
            rec.update(compile_s=3.0, temp_bytes_per_device=temp)
        lines.append(json.dumps(rec))
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_strategy_sweep_gather_and_plot(tmp_path):
    import _common
    import strategy_sweep

    sweep = tmp_path / "sweep"
    for i, (p, s) in enumerate([(p, s) for s in (256, 512) for p in ("ring", "allgather", "usp", "a2a")]):
        _fake_run(sweep / f"{i}-{p}-{s}", p, s, [5.0, 4.0, 3.5], tps=100.0 * (i + 1))
    rows = strategy_sweep.gather(sweep)
    assert [(r["plan"], r["seq_len"]) for r in rows][:3] == [("allgather", 256), ("allgather", 512), ("a2a", 256)]
    r = rows[0]
    assert r["tokens_per_sec"] == 200.0  # median of the steps after the first
    assert r["temp_mib_per_device"] == 10.0 and r["final_loss"] == 3.5 and r["mesh"] == "data2xcontext4"
    # what reproduces the row, never the directory it ran in (a path of the machine that made it)
    assert str(tmp_path) not in repr(rows) and "run_dir" not in r
    assert (r["git_commit"], r["python"], r["jax"]) == ("0123456789ab", "3.11.7", "0.10.2")
    out = tmp_path / "res.v2"  # a dot in the stem is kept, not taken for a suffix
    assert strategy_sweep.main(["--runs", str(sweep), "--out", str(out)]) == 0
    got = _common.read_csv(tmp_path / "res.v2.csv")
    assert len(got) == 8 and float(got[0]["final_loss"]) == 3.5
    assert (tmp_path / "res.v2.png").stat().st_size > 10_000
    assert _common.out_file(tmp_path / "res.csv", ".png") == tmp_path / "res.png"


def test_load_balance_work_counts(tmp_path):
    import load_balance

    rows = load_balance.work_rows(1024, [4], ["contiguous", "zigzag"])
    contiguous = [r for r in rows if r["layout"] == "contiguous"]
    zigzag = [r for r in rows if r["layout"] == "zigzag"]
    assert sum(r["pairs"] for r in contiguous) == sum(r["pairs"] for r in zigzag) == 1024 * 1025 // 2
    assert len({r["pairs"] for r in zigzag}) == 1 and round(contiguous[0]["imbalance_max_over_mean"], 2) == 1.75
    load_balance.plot(rows, tmp_path / "lb.png")
    assert (tmp_path / "lb.png").stat().st_size > 10_000


def test_load_balance_documents_counts_packed_rows(tmp_path):
    import csv

    import load_balance

    argv = ["--documents", "--out", str(tmp_path / "lb")]
    argv += [
        "load_balance.documents.rows=2",
        "load_balance.documents.seq_lens=[8192]",
        "load_balance.documents.degrees=[4]",
    ]
    assert load_balance.main(argv) == 0
    rows = list(csv.DictReader((tmp_path / "lb_documents.csv").open()))
    need = {"data", "layout", "seq_len", "P", "max_over_mean", "executed_over_visible_tiles"}
    assert need <= set(rows[0]) and len(rows) == 2 * 3  # stdlib, passkey x three layouts
    by = {(r["data"], r["layout"]): float(r["max_over_mean"]) for r in rows}
    assert by[("stdlib", "balanced")] <= by[("stdlib", "zigzag")] and by[("passkey", "zigzag")] == 1.0
    assert (tmp_path / "lb_documents.png").stat().st_size > 10_000


def test_ledger_reproduction_agrees_at_published_precision(tmp_path):
    import ledger_reproduction as lr

    assert lr.agrees(1.1215e15, "1.12e15") and not lr.agrees(1.1251e15, "1.12e15")
    assert lr.agrees(48.806, "48.80", truncated=True) and not lr.agrees(48.806, "48.80")
    assert lr.main(["--out", str(tmp_path / "ledger")]) == 0


def test_passkey_run_dir_that_cannot_be_evaluated_is_one_line(tmp_path, capsys):
    # a missing or wrong --run-dir gave a raw FileNotFoundError traceback
    import passkey

    missing = tmp_path / "nonexistent"
    assert passkey.main(["--run-dir", str(missing), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"--run-dir {missing}: does not exist" in err and "schedule.json" in err
    assert passkey.run_dir_problem(tmp_path).startswith(f"--run-dir {tmp_path}: no run_info.json in {tmp_path}")
    (tmp_path / "run_info.json").write_text(json.dumps({"checkpoint_dir": None, "config": {}}))
    assert "saved no checkpoint" in passkey.run_dir_problem(tmp_path)
    (tmp_path / "run_info.json").write_text(json.dumps({"checkpoint_dir": str(tmp_path / "ckpt")}))
    assert f"checkpoint directory {tmp_path / 'ckpt'} does not exist" in passkey.run_dir_problem(tmp_path)
    (tmp_path / "ckpt").mkdir()
    assert passkey.run_dir_problem(tmp_path) is None
    assert not (tmp_path / "out.csv").exists()


# ------------------------------------------------------------------ partial runs keep the committed results
def test_ledger_vs_compiled_partial_run_writes_no_csv(tmp_path, monkeypatch, capsys):
    """`ledger_vs_compiled.py --seq-len 4096 --strategy ring --remat full none` replaced the
    committed 32-row CSV with 2 rows; a partial selection writes only to an explicit --csv."""
    import ledger_vs_compiled as lvc

    committed = tmp_path / "committed.csv"
    committed.write_text("the committed rows\n")
    monkeypatch.setattr(lvc, "CSV", committed)
    monkeypatch.setattr(
        lvc,
        "compare",
        lambda name, S, remat, model, diagnostics: dict(
            strategy=name,
            seq_len=S,
            remat=remat,
            ledger_mib=1.0,
            compiled_mib=1.0,
            ratio=1.0,
            **(dict(live_peak_mib=1.0, ratio_live=1.0, memopt_mib=1.0, ratio_memopt=1.0) if diagnostics else {}),
        ),
    )
    assert lvc.main(["--seq-len", "4096", "--strategy", "ring", "--remat", "full", "none", "--no-diagnostics"]) == 0
    assert committed.read_text() == "the committed rows\n"
    assert (
        "partial run (--seq-len, --remat, --strategy, --diagnostics not the defaults): no CSV written"
        in capsys.readouterr().out
    )
    mine = tmp_path / "mine.csv"
    assert lvc.main(["--seq-len", "4096", "--strategy", "ring", "--remat", "full", "--csv", str(mine)]) == 0
    assert mine.read_text().count("\n") == 2 and committed.read_text() == "the committed rows\n"
    assert lvc.main([]) == 0  # the full default run still writes the committed file
    assert committed.read_text().count("\n") == 1 + 2 * 4 * 4


def test_memory_vs_degree_run_with_overrides_writes_nothing(tmp_path, monkeypatch, capsys):
    import memory_vs_degree as mvd

    monkeypatch.setattr(mvd.C, "RESULTS", tmp_path)
    monkeypatch.setattr(mvd, "run", lambda overrides: [])
    assert mvd.main(["memory_vs_degree.seq_lens=[4096]"]) == 0
    assert not list(tmp_path.iterdir())
    assert (
        "partial run (overrides ['memory_vs_degree.seq_lens=[4096]']): no CSV or PNG written" in capsys.readouterr().out
    )


def test_length_extension_eval_gathers_scores_losses_and_provenance(tmp_path, capsys):
    import _common
    import length_extension_eval as le

    root, docs = tmp_path / "run", tmp_path / "docs"
    stage = root / "train_yarn" / "stage1_long"
    stage.mkdir(parents=True)
    (root / "train_yarn" / "schedule.json").write_text(json.dumps([{"run_dir": str(stage)}]))
    info = {"git_commit": "0123456789abcdef", "python": "3.12.1", "packages": {"jax": "0.12.0"}}
    (stage / "run_info.json").write_text(json.dumps(info))
    for i, cond in enumerate(le.CONDITIONS):
        d = root / f"eval_{cond}"
        d.mkdir()
        means = {"256": 1.0, "512": 0.5 * i, "1024": 0.0, "2048": 0.0}
        eff = 512 if i == 2 else (256 if i else None)
        (d / "ruler.json").write_text(json.dumps({"mean_by_length": means, "effective_length": eff, "threshold": 0.5}))
        (d / "ruler.csv").write_text("task,seq_len,depth,samples,score,max_new_tokens\npasskey,256,0.5,2,1.0,15\n")
        (d / "perplexity_by_position.csv").write_text(
            "bin_start,bin_end,tokens,nll,perplexity\n0,128,512,5.0,148.4\n128,256,512,4.5,90.0\n"
        )
        (d / "ruler_heatmap.png").write_bytes(b"png")
    docs.mkdir()
    assert le.main(["--runs", str(root), "--out", str(tmp_path / "res"), "--docs", str(docs)]) == 0
    summary = _common.read_csv(tmp_path / "res_summary.csv")
    assert [(r["condition"], r["mean_1x"], r["mean_2x"], r["effective_length"]) for r in summary] == [
        ("short", "1", "0", "none"),
        ("plain", "1", "0.5", "256"),
        ("yarn", "1", "1", "512"),
    ]
    cells = _common.read_csv(tmp_path / "res.csv")
    assert len(cells) == 3 and cells[0]["git_commit"] == "0123456789ab" and cells[0]["jax"] == "0.12.0"
    assert str(tmp_path) not in (tmp_path / "res.csv").read_text()  # never a local path
    assert len(_common.read_csv(tmp_path / "res_loss.csv")) == 6
    assert sorted(p.name for p in docs.iterdir()) == [
        "length_extension_eval.png",
        *(f"length_extension_{c}_heatmap.png" for c in sorted(le.CONDITIONS)),
    ]
    assert le.main(["--runs", str(tmp_path / "nothing")]) == 2
    assert "no eval_yarn/ruler.json" in capsys.readouterr().err


def test_length_extension_study_gathers_cells_seeds_steps_and_the_middle(tmp_path, capsys):
    import _common
    import length_extension_study as st

    root, docs = tmp_path / "run", tmp_path / "docs"
    info = {"git_commit": "0123456789abcdef", "python": "3.12.1", "packages": {"jax": "0.12.1"}}
    (root / "base_run").mkdir(parents=True)
    (root / "base_run" / "run_info.json").write_text(json.dumps(info))
    (root / "study.json").write_text(json.dumps({"base_run": str(root / "base_run")}))
    conds = st.conditions(type("A", (), {"steps": 100, "seeds": [0, 1]})())
    assert len(conds) == 3 * len(st.METHODS)
    for c in conds:
        d = root / "eval" / c["tag"]
        d.mkdir(parents=True)
        ft = c["finetune_steps"] > 0
        # fine-tuned: 100 at L..4L and seed-dependent at 8L; no fine-tune: 100 at L only
        s8 = {0: 60.0, 1: 80.0}.get(c["seed"], 0.0)
        means = {"256": 100.0, "512": 90.0 if ft else 0.0, "1024": 90.0 if ft else 0.0, "2048": s8}
        (d / "ruler.json").write_text(
            json.dumps({"mean_by_length": means, "effective_length": 1024 if ft else 256, "threshold": 85.6})
        )
        lines = ["task,seq_len,depth,samples,score,max_new_tokens,reason"]
        for s, v in means.items():
            lines += [f"passkey,{s},{d_},20,{v if d_ != 0.5 else v / 2},15," for d_ in (0.0, 0.5, 1.0)]
            lines.append(f"vt,{s},,20,{v},43,")
        (d / "ruler.csv").write_text("\n".join(lines) + "\n")
        (d / "perplexity_by_position.csv").write_text("bin_start,bin_end,tokens,nll,perplexity\n0,128,512,5.0,148.4\n")
        if ft:
            run = root / "ft_run" / f"{c['method']}_s{c['seed']}"
            run.mkdir(parents=True)
            (run / "run_info.json").write_text(json.dumps(info))
            recs = [{"step": 25, "long_eval/mean": 40.0, "long_eval/vt": 10.0}, {"step": 30, "loss": 1.0}]
            (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    docs.mkdir()
    assert st.main(["--runs", str(root), "--out", str(tmp_path / "res"), "--docs", str(docs)]) == 0
    cells = _common.read_csv(tmp_path / "res.csv")
    assert len(cells) == len(conds) * 4 * 4
    need = {
        "method",
        "finetune_steps",
        "seed",
        "train_len",
        "seq_len",
        "task",
        "depth",
        "samples",
        "score",
        "git_commit",
    }
    assert need <= set(cells[0]) and cells[0]["git_commit"] == "0123456789ab"
    assert str(tmp_path) not in (tmp_path / "res.csv").read_text()  # never a local path
    summary = _common.read_csv(tmp_path / "res_summary.csv")
    mean = [r for r in summary if r["seed"] == "mean"]
    assert [r["method"] for r in mean] == list(st.METHODS)
    assert (
        float(mean[0]["mean_8L"]) == 70.0
        and float(mean[0]["spread_8L"]) == 10.0
        and mean[0]["effective_length"] == "1024"
    )
    steps = _common.read_csv(tmp_path / "res_steps.csv")
    assert len(steps) == 2 * len(st.METHODS) and steps[0]["step"] == "25" and float(steps[0]["mean"]) == 40.0
    middle = _common.read_csv(tmp_path / "res_middle.csv")
    assert {r["seq_len"] for r in middle} == {"1024", "2048"} and middle[0]["seed"] == "1"  # the better seed
    assert [float(r["score"]) for r in middle if r["seq_len"] == "1024"] == [90.0, 45.0, 90.0]
    assert sorted(p.name for p in docs.iterdir()) == [
        "res.png",
        "res_heatmaps.png",
        "res_middle.png",
        "res_steps.png",
    ]
    assert st.main(["--runs", str(tmp_path / "nothing")]) == 2
    assert "no study.json" in capsys.readouterr().err
