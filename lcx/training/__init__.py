"""Training: loss, optimizer, sharded train/eval steps, the loop, run metadata."""

from lcx.training.loss import loss_sum_and_count as loss_sum_and_count, token_nll as token_nll
from lcx.training.optim import make_optimizer as make_optimizer
from lcx.training.step import Steps as Steps, make_steps as make_steps, put_batch as put_batch
