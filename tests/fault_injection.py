"""``vcr/train_end2end.py`` with faults injected, for the resume and launch tests.

    python tests/fault_injection.py ARGS...   (or as SCRIPT of a launch script) = vcr/train_end2end.py ARGS...

The real entry point runs unchanged in this process (through runpy); environment variables add:

    FAULT_KILL_AFTER_STEP=n  SIGKILL this process right after optimizer step n (after that step's
                             checkpoint), the TensorBoard events flushed first, as a run that
                             lived on would have flushed them (tensorboardX flushes every 120 s)
    FAULT_KILL_IN_SAVE=n     SIGKILL this process while it writes its n-th checkpoint file
    FAULT_FAIL_RANK=r        raise RuntimeError on rank r at its first micro-batch
    FAULT_ENTRY=path         run this entry point instead (pretrain/train_end2end.py)
"""
import os
import runpy
import signal
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENTRY = os.environ.get("FAULT_ENTRY", os.path.join(ROOT, "vcr", "train_end2end.py"))


def _fault_hook():
    """A hook that runs after the checkpoint hooks at each micro-batch end."""
    from common.hooks.base import HookBase

    class FaultHook(HookBase):
        def after_batch(self, ctx):
            kill_after = int(os.environ.get("FAULT_KILL_AFTER_STEP", -1))
            if ctx.step_ended and ctx.state["global_step"] == kill_after:
                if ctx.writer is not None:
                    ctx.writer.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            if str(ctx.rank or 0) == os.environ.get("FAULT_FAIL_RANK"):
                raise RuntimeError("injected failure on rank {}".format(ctx.rank))
    return FaultHook()


def _install_batch_end_fault():
    """Append the fault to the checkpoint hooks the engine builds (so it runs after them)."""
    import common.engine

    real = common.engine.checkpoint_hooks

    def checkpoint_hooks(checkpointer, cfg, steps_per_epoch=0):
        return real(checkpointer, cfg, steps_per_epoch) + [_fault_hook()]
    common.engine.checkpoint_hooks = checkpoint_hooks


def _install_kill_in_save(n):
    """The n-th ``torch.save`` of this process writes a part of the file, then SIGKILL."""
    import torch

    real, calls = torch.save, [0]

    def save(obj, f, *args, **kwargs):
        calls[0] += 1
        if calls[0] == n:
            f.write(b"\x80\x02partial checkpoint")
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return real(obj, f, *args, **kwargs)
    torch.save = save


def main():
    sys.path[:0] = [ROOT, os.path.dirname(ENTRY)]
    _install_batch_end_fault()
    if "FAULT_KILL_IN_SAVE" in os.environ:
        _install_kill_in_save(int(os.environ["FAULT_KILL_IN_SAVE"]))
    sys.argv[0] = ENTRY
    runpy.run_path(ENTRY, run_name="__main__")


if __name__ == "__main__":
    main()
