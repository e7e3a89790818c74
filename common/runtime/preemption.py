"""Preemption: SIGTERM / SIGUSR1 stop training at the next optimizer step, with a checkpoint.

SLURM sends SIGTERM on ``scancel`` and preemption, and the signal of ``--signal=USR1@120`` before
the time limit. :class:`PreemptionGuard` turns either into a request; the hook
:class:`common.hooks.checkpoint.PreemptionCheckpoint` makes every rank agree on it at the next step
boundary (one 1-element all-reduce per optimizer step), writes the mid-epoch checkpoint of that
position and raises :class:`Preempted`; the engine exits with :data:`PREEMPTED_EXIT_CODE`.

A second signal, or no step boundary within :data:`STEP_WAIT_S` seconds of the first (a step or a
validation that does not end, a peer that hangs), exits at once with ``128 + signal number`` and no
new checkpoint; the log says which. The same signal again within :data:`REPEAT_S` seconds is the same
request: at a time limit SLURM's step daemon and ``srun`` each send SIGTERM to the task (measured 20 ms apart).

SLURM signals every process of a job step, DataLoader workers included; PyTorch's worker handler dies of a
SIGTERM that its parent did not send. :func:`worker_ignore_stop_signals` (every loader's
``worker_init_fn``) makes the workers leave the stop to their rank process.
"""
import os
import signal
import threading
import time

from common.runtime.logs import get_logger

# sysexits.h EX_TEMPFAIL ("temporary failure, try again"): a checkpoint was written, requeue the job.
PREEMPTED_EXIT_CODE = 75
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
# Seconds from the first signal to the next step boundary before giving up on the checkpoint;
# SLURM's --signal=USR1@120 leaves 120 s before SIGKILL for the step, the save and the exit.
STEP_WAIT_S = 60
# Seconds within which a repeat of the first signal counts as the same request, not as a second one.
REPEAT_S = 5

logger = get_logger("preemption")


def worker_ignore_stop_signals(worker_id=None):
    """``worker_init_fn`` of the DataLoaders: this worker ignores :data:`STOP_SIGNALS` sent by anyone but its
    parent (the rank process stops at the step boundary and shuts its workers down itself).

    SIGUSR1 is ignored. SIGTERM is blocked and taken by a daemon thread (``signal.sigwaitinfo``): from the
    parent (``multiprocessing``'s ``terminate`` at exit) the worker exits with code 0, as PyTorch's own
    worker handler does (``torch/csrc/DataLoader.cpp``, ``handler_SIGTERM``); from anyone else it is dropped.
    """
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # threads started later inherit the mask
    threading.Thread(target=_take_sigterm, args=(os.getppid(),), name="sigterm", daemon=True).start()


def _take_sigterm(parent):
    while True:
        if signal.sigwaitinfo({signal.SIGTERM}).si_pid == parent:
            os._exit(0)


class Preempted(Exception):
    """Raised on every rank once the preemption checkpoint is written (message: where training stopped)."""


class PreemptionGuard:
    """Signal handlers for :data:`STOP_SIGNALS`, installed while the guard is entered (``with guard:``).

    ``requested`` is the first signal's number (None: no request). Handlers run in the main
    thread; in a forked DataLoader worker the signal is ignored (its parent stops it).

    Args:
        wait_s: seconds from the first signal to :meth:`reached` before exiting at once.
    """

    def __init__(self, wait_s: float = STEP_WAIT_S):
        self.wait_s = wait_s
        self.requested = None
        self._pid = os.getpid()
        self._previous = {}
        self._timer = None
        self._since = None

    def __enter__(self):
        self._pid = os.getpid()
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        self.reached()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        return False

    def _handle(self, signum, frame):
        if os.getpid() != self._pid:
            return
        name = signal.Signals(signum).name
        if signum == self.requested and time.monotonic() - self._since < REPEAT_S:
            return
        if self.requested is not None:
            logger.warning("second stop signal (%s): exiting at once with code %d, without a checkpoint",
                           name, 128 + signum)
            os._exit(128 + signum)
        self.requested, self._since = signum, time.monotonic()
        logger.warning("%s received: stopping at the end of this optimizer step, then saving a checkpoint and "
                       "exiting with code %d (a second signal, or no step end within %g s, exits at once)",
                       name, PREEMPTED_EXIT_CODE, self.wait_s)
        self._timer = threading.Timer(self.wait_s, self._give_up, args=(signum,))
        self._timer.daemon = True
        self._timer.start()

    def _give_up(self, signum):
        logger.warning("no optimizer step ended within %g s of %s: exiting at once with code %d, without a "
                       "checkpoint", self.wait_s, signal.Signals(signum).name, 128 + signum)
        os._exit(128 + signum)

    def reached(self):
        """The ranks agreed to stop (or training ended): cancel the :data:`STEP_WAIT_S` deadline."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
