"""End-of-run summary hook: what a user checks first after a run (loss scale, skipped steps, step time)."""
import time

from common.logs import get_logger

from .base import HookBase

logger = get_logger(__name__)


class RunSummary(HookBase):
    """Logs on rank 0, when training ends, ``Training summary: N optimizer steps applied, M skipped
    (inf/nan gradients); final loss scale S; T s per optimizer step (K steps in W s of training in
    this run)``. N and M count the whole run (resumes included); T is the training wall time of
    this process (from each epoch's start to its last optimizer step, validation excluded) divided
    by the optimizer steps it tried (applied or skipped)."""

    def __init__(self):
        self.attempts = 0
        self.train_seconds = 0.0
        self.tic = self.last = None

    def before_epoch(self, ctx):
        self.tic = self.last = time.perf_counter()

    def after_batch(self, ctx):
        if ctx.step_ended:
            self.attempts += 1
            self.last = time.perf_counter()

    def after_epoch(self, ctx):
        self.train_seconds += self.last - self.tic

    def after_train(self, ctx):
        if not ctx.is_main:
            return
        state = ctx.state
        per_step = self.train_seconds / self.attempts if self.attempts else float("nan")
        logger.info("Training summary: %d optimizer steps applied, %d skipped (inf/nan gradients); final loss "
                    "scale %g; %.4f s per optimizer step (%d steps in %.1f s of training in this run)",
                    state["global_step"], state["skipped_steps"], ctx.scaler.scale, per_step, self.attempts,
                    self.train_seconds)
