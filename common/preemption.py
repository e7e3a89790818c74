"""Preemption: SIGTERM / SIGUSR1 stop training at the next optimizer step, with a checkpoint.

SLURM sends SIGTERM on ``scancel`` and preemption, and the signal of ``--signal=USR1@120`` before
the time limit. :class:`PreemptionGuard` turns either into a request; the hook
:class:`common.hooks.checkpoint.PreemptionCheckpoint` makes every rank agree on it at the next step
boundary (one 1-element all-reduce per optimizer step), writes the mid-epoch checkpoint of that
position and raises :class:`Preempted`; the engine exits with :data:`PREEMPTED_EXIT_CODE`.

A second signal, or no step boundary within :data:`STEP_WAIT_S` seconds of the first (a step or a
validation that does not end, a peer that hangs), exits at once with ``128 + signal number`` and no
new checkpoint; the log says which.
"""
import os
import signal
import threading

from common.logs import get_logger

# sysexits.h EX_TEMPFAIL ("temporary failure, try again"): a checkpoint was written, requeue the job.
PREEMPTED_EXIT_CODE = 75
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
# Seconds from the first signal to the next step boundary before giving up on the checkpoint;
# SLURM's --signal=USR1@120 leaves 120 s before SIGKILL for the step, the save and the exit.
STEP_WAIT_S = 60

logger = get_logger("preemption")


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
        if self.requested is not None:
            logger.warning("second stop signal (%s): exiting at once with code %d, without a checkpoint",
                           name, 128 + signum)
            os._exit(128 + signum)
        self.requested = signum
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
