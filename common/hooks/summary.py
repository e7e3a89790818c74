"""End-of-run summary hook: what a user checks first after a run (loss scale, skipped steps, step time)."""
from common.runtime.logs import get_logger

from .base import HookBase

logger = get_logger(__name__)


class RunSummary(HookBase):
    """Logs on rank 0, when training ends, ``Training summary: N optimizer steps applied, M skipped
    (inf/nan gradients); final loss scale S; T s per optimizer step (K steps in W s of training in
    this run)``. N and M count the whole run (resumes included); K and W are the step record's
    (:mod:`common.step_record`) tried optimizer steps and training seconds since this run started
    (validation excluded), T their ratio. A run that resumed with nothing left to train (a rerun of a
    finished one) ends the line with ``no optimizer step in this run (nothing was left to train)``."""

    def __init__(self):
        self.mark = None

    def before_train(self, ctx):
        self.mark = ctx.record.mark()

    def after_train(self, ctx):
        if not ctx.is_main:
            return
        state, run = ctx.state, ctx.record.since(self.mark)
        if run.tried_steps:
            speed = "{:.4f} s per optimizer step ({} steps in {:.1f} s of training in this run)".format(
                run.seconds / run.tried_steps, run.tried_steps, run.seconds)
        else:
            speed = "no optimizer step in this run (nothing was left to train)"
        logger.info("Training summary: %d optimizer steps applied, %d skipped (inf/nan gradients); final loss "
                    "scale %g; %s", state["global_step"], state["skipped_steps"], ctx.scaler.scale, speed)
