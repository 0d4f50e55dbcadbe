"""Training: loss (whole or in vocabulary tiles), optimizer, sharded train/eval steps with host
offload, the state (:class:`TrainState`), the loop and its hooks, checkpoints, the preflight
checks, run metadata."""

from lcx.training.hooks import Hooks as Hooks
from lcx.training.hooks import StepInfo as StepInfo
from lcx.training.loss import (
    VocabTiles as VocabTiles,
)
from lcx.training.loss import (
    loss_sum_and_count as loss_sum_and_count,
)
from lcx.training.loss import (
    token_nll as token_nll,
)
from lcx.training.loss import (
    vocab_tiled_loss_sum_and_count as vocab_tiled_loss_sum_and_count,
)
from lcx.training.loss import (
    vocab_tiled_predictions as vocab_tiled_predictions,
)
from lcx.training.memory import MemoryOptions as MemoryOptions
from lcx.training.optim import make_optimizer as make_optimizer
from lcx.training.state import TrainResult as TrainResult
from lcx.training.state import TrainState as TrainState
from lcx.training.step import (
    Steps as Steps,
)
from lcx.training.step import (
    loss_function as loss_function,
)
from lcx.training.step import (
    make_steps as make_steps,
)
from lcx.training.step import (
    put_batch as put_batch,
)
