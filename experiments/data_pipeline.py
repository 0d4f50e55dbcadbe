"""The grain data pipeline's throughput next to what the model consumes (issue 39).

Measures, on this machine, into ``experiments/results/data_pipeline.csv``:

1. ``bpe_train``: a byte-level BPE (``tokenizers``) trained at a 131,072-token (128K) vocabulary
   on the embedded standard-library corpus; the vocabulary it reaches (the corpus may run out of
   merges before the target) and the seconds it took.
2. ``tokenize``: that BPE tokenizing the corpus's training documents through grain
   (:func:`lcx.data.grain_pipeline.tokenize`), in the main process and in 2 worker processes.
3. ``stream``: :class:`lcx.data.GrainBatches` over those tokens with 131,072-token rows (zigzag
   layout over 4 context shards, 2 rows per batch), in 2 worker processes and in the trainer
   (``workers=0``: a prefetch thread), tokens per second handed to the trainer after the first
   batch (which pays the workers' start).
4. ``model``: the README's run (``python -m lcx.train``, the tiny model on ``data=stdlib``) for
   ``--steps`` steps with ``data.workers`` 0 and 2: the tokens per second it trains (median over
   the steps after the first) and ``data_wait_s`` as a fraction of the step time (median, and
   the whole run's total wait over its total step time).

    python experiments/data_pipeline.py              # everything (~6 min on 2 cores)
    python experiments/data_pipeline.py --skip-model # 1-3 only

A 2-core machine shares its cores between the pipeline's workers and the measured step, so the
numbers are a lower bound for a machine with cores to spare.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _common as C  # noqa: E402

NAME = "data_pipeline"
VOCAB = 131_072
SEQ_LEN = 131_072
ROWS = 2
DEGREE = 4
FIELDS = (
    "measure",
    "tokenizer",
    "vocab",
    "workers",
    "seq_len",
    "global_batch",
    "tokens",
    "seconds",
    "tokens_per_s",
    "first_batch_s",
    "step_time_s",
    "data_wait_s",
    "wait_fraction",
    "wait_total_fraction",
    "first_wait_s",
)


class BPE:
    """A ``tokenizers`` byte-level BPE with lcx's tokenizer interface (``encode`` -> int32 ids,
    ``vocab_size``); picklable, so grain's worker processes get a copy."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text).ids, dtype=np.int32)


def train_bpe(texts: list[str], vocab: int) -> tuple[BPE, float]:
    """A byte-level BPE trained on ``texts`` up to ``vocab`` tokens; and the seconds it took."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    t0 = time.perf_counter()
    tok.train_from_iterator(texts, trainer=trainer)
    return BPE(tok), time.perf_counter() - t0


def measure_tokenize(texts: list[str], bpe: BPE, workers: int) -> tuple[list[np.ndarray], float]:
    from lcx.data.grain_pipeline import tokenize

    t0 = time.perf_counter()
    docs = tokenize(texts, bpe, workers)
    return docs, time.perf_counter() - t0


def measure_stream(docs: list[np.ndarray], workers: int, batches: int) -> dict:
    """Tokens per second the grain stream hands out (after its first batch)."""
    from lcx.data import GrainBatches, Packer
    from lcx.data.order import EndlessRows

    rows = EndlessRows(Packer(docs, SEQ_LEN), (0,), source=0)
    stream = GrainBatches(
        [[rows]],
        names=["stdlib"],
        weights=[1.0],
        total_shards=1,
        identity={"seed": 0, "shuffle": 1, "num_docs": len(docs)},
        workers=workers,
        prefetch=2,
        seq_len=SEQ_LEN,
        global_batch=ROWS,
        layout="zigzag",
        context_degree=DEGREE,
    )
    try:
        t0 = time.perf_counter()
        next(stream)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(batches):
            next(stream)
        dt = time.perf_counter() - t0
    finally:
        stream.close()
    return {"first_batch_s": first, "seconds": dt, "tokens_per_s": batches * ROWS * SEQ_LEN / dt}


def measure_model(workers: int, steps: int) -> dict:
    """The README's run for ``steps`` steps: trained tokens/s and the data wait's share."""
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-m", "lcx.train", f"train.steps={steps}", f"data.workers={workers}"]
        cmd += ["train.eval_every=0", "train.tensorboard=false", f"hydra.run.dir={d}"]
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, cwd=C.ROOT, check=True, stdout=subprocess.DEVNULL)
        m = C.read_jsonl(pathlib.Path(d) / "metrics.jsonl")
    steady = m[1:]
    frac = [r["data_wait_s"] / r["step_time_s"] for r in steady]
    return {
        "tokens_per_s": statistics.median(r["tokens_per_sec"] for r in steady),
        "step_time_s": statistics.median(r["step_time_s"] for r in steady),
        "data_wait_s": statistics.median(r["data_wait_s"] for r in steady),
        "wait_fraction": statistics.median(frac),
        "wait_total_fraction": sum(r["data_wait_s"] for r in steady) / sum(r["step_time_s"] for r in steady),
        "first_wait_s": m[0]["data_wait_s"],
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=20, help="stream batches timed (after the first)")
    ap.add_argument("--steps", type=int, default=12, help="steps of each README run")
    ap.add_argument("--skip-model", action="store_true", help="only the pipeline (1-3)")
    args = ap.parse_args(argv)

    from lcx.data import split_documents, stdlib_corpus

    texts = [t for t in stdlib_corpus().documents if t]
    train, _ = split_documents(len(texts), 0.02, 0)
    texts = [texts[i] for i in train]
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=C.ROOT, capture_output=True, text=True)
    common = {"python": platform.python_version(), "cores": os.cpu_count(), "git_commit": commit.stdout.strip()}
    out = []

    bpe, secs = train_bpe(texts, VOCAB)
    print(f"BPE: vocabulary {bpe.vocab_size} (asked {VOCAB}) in {secs:.1f} s", flush=True)
    out.append({"measure": "bpe_train", "tokenizer": "bpe", "vocab": bpe.vocab_size, "seconds": secs})

    docs = None
    for workers in (0, 2):
        docs, secs = measure_tokenize(texts, bpe, workers)
        n = int(sum(d.size for d in docs))
        print(f"tokenize, {workers} workers: {n} tokens in {secs:.1f} s = {n / secs:,.0f} tokens/s", flush=True)
        row = {"measure": "tokenize", "tokenizer": "bpe", "vocab": bpe.vocab_size, "workers": workers}
        out.append({**row, "tokens": n, "seconds": secs, "tokens_per_s": n / secs})
    assert docs is not None

    for workers in (2, 0):
        r = measure_stream(docs, workers, args.batches)
        print(f"stream, {workers} workers: {r['tokens_per_s']:,.0f} tokens/s (first batch {r['first_batch_s']:.1f} s)")
        row = {"measure": "stream", "tokenizer": "bpe", "vocab": bpe.vocab_size, "workers": workers}
        out.append({**row, "seq_len": SEQ_LEN, "global_batch": ROWS, **r})

    if not args.skip_model:
        for workers in (0, 2):
            r = measure_model(workers, args.steps)
            print(f"model, {workers} workers: {json.dumps(r)}", flush=True)
            row = {"measure": "model", "tokenizer": "byte", "vocab": 256, "workers": workers}
            out.append({**row, "seq_len": 4096, "global_batch": 4, **r})

    rows = [{**dict.fromkeys(FIELDS, ""), **r, **common} for r in out]
    path = C.write_csv([{k: r[k] for k in (*FIELDS, *common)} for r in rows], C.RESULTS / f"{NAME}.csv")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
