"""Training: loss (whole or in vocabulary tiles), optimizer, sharded train/eval steps with host
offload, the state (:class:`TrainState`), the loop and its hooks, checkpoints, the preflight
checks, run metadata; the teacher-forced evaluations that reuse the loss (passkey retrieval,
:mod:`lcx.training.retrieval`; loss by position, :mod:`lcx.training.perplexity`)."""

from lcx.training.config import MemoryOptions
from lcx.training.hooks import Hooks
from lcx.training.loss import (
    VocabTiles,
    loss_sum_and_count,
    token_nll,
    vocab_tiled_loss_sum_and_count,
    vocab_tiled_predictions,
)
from lcx.training.optim import make_optimizer
from lcx.training.state import TrainResult, TrainState
from lcx.training.step import Steps, loss_function, make_steps
from lcx.training.stepping import StepInfo, put_batch

__all__ = [
    "Hooks",
    "loss_function",
    "loss_sum_and_count",
    "make_optimizer",
    "make_steps",
    "MemoryOptions",
    "put_batch",
    "StepInfo",
    "Steps",
    "token_nll",
    "TrainResult",
    "TrainState",
    "vocab_tiled_loss_sum_and_count",
    "vocab_tiled_predictions",
    "VocabTiles",
]
