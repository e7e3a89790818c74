"""torchrun (``torch.distributed.run``, same arguments) for scripts/dist_run_single.sh and dist_run_multi.sh.

A user mistake that the ranks report (exit code 2, their ``error:`` lines written to a folder of
:mod:`common.runtime.rank_errors`) ends the launch with each distinct message once and exit code 2: no copy per
rank, no torchrun traceback, none of its "closing signal" / "failed (exitcode: 2)" log lines. Any other
failure keeps torchrun's report (and exit code).

    python scripts/torchrun.py [torchrun options] SCRIPT [script args...]
"""
import logging
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError  # noqa: E402
from torch.distributed.run import parse_args, run  # noqa: E402

from common.runtime import rank_errors  # noqa: E402

# torchrun's logger of the workers' ends
AGENT_LOGGER = "torch.distributed.elastic.multiprocessing.api"


class _UserErrorNoise(logging.Filter):
    """Drops torchrun's lines about ending the workers once a rank has reported a user mistake."""

    def __init__(self, folder):
        super().__init__()
        self.folder = folder

    def filter(self, record):
        message = record.getMessage()
        about_the_end = "closing signal" in message or message.startswith("failed (exitcode")
        user_error = message.startswith("failed (exitcode: {})".format(rank_errors.USER_ERROR_EXIT_CODE))
        return not (about_the_end and (user_error or rank_errors.distinct_messages(self.folder)))


def main(argv):
    """Run torchrun with ``argv``; returns the exit code (0, or 2 for a user mistake). Other failures raise
    torchrun's ChildFailedError."""
    args = parse_args(argv)
    if "OMP_NUM_THREADS" not in os.environ and args.nproc_per_node.isdigit() and int(args.nproc_per_node) > 1:
        os.environ["OMP_NUM_THREADS"] = "1"  # torchrun's own default, without its banner about it
    folder = tempfile.mkdtemp(prefix="vlbert-rank-errors-")
    os.environ[rank_errors.ENV] = folder
    noise = _UserErrorNoise(folder)
    logging.getLogger(AGENT_LOGGER).addFilter(noise)
    try:
        run(args)
        return 0
    except ChildFailedError as e:
        sys.stderr.write("".join(rank_errors.distinct_messages(folder)))
        if e.get_first_failure()[1].exitcode == rank_errors.USER_ERROR_EXIT_CODE:  # said by the rank(s)
            return rank_errors.USER_ERROR_EXIT_CODE
        raise
    finally:
        logging.getLogger(AGENT_LOGGER).removeFilter(noise)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
