"""End-of-run summary hook: what a user checks first after a run (loss scale, skipped steps, step time)."""
from common.runtime.logs import get_logger

from .base import HookBase

logger = get_logger(__name__)


class RunSummary(HookBase):
    """Logs on rank 0, when training ends, ``Training summary: N optimizer steps applied, M skipped
    (inf/nan gradients); final loss scale S; T s per optimizer step (K steps in W s of training in
    this run)``. N and M count the whole run (resumes included); K and W are the step record's
    (:mod:`common.step_record`) tried optimizer steps and training seconds since this run started
    (validation excluded), T their ratio."""

    def __init__(self):
        self.mark = None

    def before_train(self, ctx):
        self.mark = ctx.record.mark()

    def after_train(self, ctx):
        if not ctx.is_main:
            return
        state, run = ctx.state, ctx.record.since(self.mark)
        per_step = run.seconds / run.tried_steps if run.tried_steps else float("nan")
        logger.info("Training summary: %d optimizer steps applied, %d skipped (inf/nan gradients); final loss "
                    "scale %g; %.4f s per optimizer step (%d steps in %.1f s of training in this run)",
                    state["global_step"], state["skipped_steps"], ctx.scaler.scale, per_step, run.tried_steps,
                    run.seconds)
