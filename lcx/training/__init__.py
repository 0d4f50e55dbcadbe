"""Training: loss (whole or in vocabulary tiles), optimizer, sharded train/eval steps with host
offload, the state (:class:`TrainState`), the loop and its hooks, checkpoints, the preflight
checks, run metadata."""

from lcx.training.loss import (
    loss_sum_and_count as loss_sum_and_count,
    token_nll as token_nll,
    vocab_tiled_loss_sum_and_count as vocab_tiled_loss_sum_and_count,
    vocab_tiled_predictions as vocab_tiled_predictions,
)
from lcx.training.hooks import Hooks as Hooks, StepInfo as StepInfo
from lcx.training.memory import MemoryOptions as MemoryOptions
from lcx.training.optim import make_optimizer as make_optimizer
from lcx.training.step import (
    Steps as Steps,
    loss_function as loss_function,
    make_steps as make_steps,
    put_batch as put_batch,
)
from lcx.training.state import TrainResult as TrainResult, TrainState as TrainState
