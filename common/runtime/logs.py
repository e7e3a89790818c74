"""Logging of a run: one logger tree, ``vlbert``, printed on the console and written to the run's log file.

Every product module logs through :func:`get_logger` (a child of ``vlbert``). Python warnings
(``logging.captureWarnings``) and the records of other libraries' loggers that reach the root
logger (warnings and errors by default) go to the same handlers, so the log
file in the output folder holds every line the run prints. Lines logged before the file exists
(config loading, say) are kept in memory and written to it when :func:`setup_run_logging` opens it.

The console handler writes to stdout; ranks other than 0 show warnings and errors only, and errors only until
the run's logging is set up (the config's warnings are rank 0's to say).
"""
import logging
import logging.handlers
import sys

from common.runtime.rank_errors import launch_rank

NAME = "vlbert"
WARNINGS = "py.warnings"  # the logger of logging.captureWarnings
FORMAT = logging.Formatter("%(asctime)s %(message)s")
# Records kept until the log file opens; far more than config loading ever logs.
_BUFFER_CAPACITY = 10000


def get_logger(name):
    """``vlbert.<name>``: a product logger whose lines reach the console and the run's log file."""
    return logging.getLogger("{}.{}".format(NAME, name))


def _console():
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(FORMAT)
    return handler


def _install(level, handlers):
    """Make ``handlers`` the only ones of ``vlbert`` and of Python warnings (at ``level``), and put
    them on the root logger in place of the ones an earlier call put there (others stay)."""
    # Off then on: a warnings.catch_warnings() that ended since the last call (pytest has one per test)
    # restored the plain showwarning, and captureWarnings(True) alone would not install it again.
    logging.captureWarnings(False)
    logging.captureWarnings(True)
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "_vlbert", False)]:
        root.removeHandler(handler)
    for logger in (logging.getLogger(NAME), logging.getLogger(WARNINGS)):
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
            if handler not in handlers:
                handler.close()
        logger.propagate = False  # (the root's handlers would print its lines twice)
        logger.setLevel(level)
    for handler in handlers:
        handler._vlbert = True
        for logger in (logging.getLogger(NAME), logging.getLogger(WARNINGS), root):
            logger.addHandler(handler)


def start_logging(level=logging.INFO):
    """Process-wide set-up (scripts call it first, through :func:`common.cli.run_main`): stdout,
    and a memory buffer that keeps the records for the log file."""
    # A skipped step's inf/nan loss and gradient norm go to TensorBoard on purpose; tensorboardX would say
    # "NaN or Inf found in input tensor." for each, naming neither value nor step (the divergence guard does).
    logging.getLogger("tensorboardX.x2num").setLevel(logging.ERROR)
    console = _console()
    if launch_rank() != 0:
        # Until the run's logging is set up, a launched job's ranks load the same config and check the same
        # inputs: rank 0 says its warnings, the others would repeat them once per rank.
        console.setLevel(logging.ERROR)
    _install(level, [console, logging.handlers.MemoryHandler(_BUFFER_CAPACITY, flushLevel=logging.CRITICAL + 1)])
    return logging.getLogger(NAME)


def setup_run_logging(log_file=None, rank=0):
    """Handlers of a training run: stdout (``vlbert`` at INFO on rank 0, else WARNING) and, when
    ``log_file`` is given, that file, which first receives the records kept since :func:`start_logging`.

    Returns:
        logging.Logger: the ``vlbert`` logger.
    """
    kept = [h for h in logging.getLogger(NAME).handlers if isinstance(h, logging.handlers.MemoryHandler)]
    handlers = [_console()]
    if log_file is not None:
        handler = logging.FileHandler(log_file)
        handler.setFormatter(FORMAT)
        for record in (kept[0].buffer if kept else []):
            handler.handle(record)
        handlers.append(handler)
    _install(logging.INFO if rank == 0 else logging.WARNING, handlers)
    return logging.getLogger(NAME)
