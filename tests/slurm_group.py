"""Forms the process group as the training entry points do, and nothing else (fast launch tests).

    scripts/dist_run_slurm.sh PART JOB tests/slurm_group.py CFG WORK_DIR N

Parses the entry points' flags (``--cfg`` is not read), calls
:func:`common.runtime.distributed.init_distributed` as :func:`common.engine.train_net` does, checks the
group with one collective and prints ``job J rank R: ranks [0, 1, ...], T threads`` (J = SLURM_JOB_ID,
T = torch's intra-op threads).
GROUP_DELAY="R:PATH" makes rank R wait until the file PATH exists before it joins (a slow start).
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from common.cli import run_main, train_argument_parser  # noqa: E402
from common.runtime import distributed as cdist  # noqa: E402


def main():
    args = train_argument_parser("form the process group").parse_args()
    late_rank, _, path = os.environ.get("GROUP_DELAY", "").partition(":")
    while os.environ.get("SLURM_PROCID") == late_rank and not os.path.exists(path):
        time.sleep(0.2)
    ctx = cdist.init_distributed(args.dist, args.slurm, timeout_s=60)
    ranks = cdist.all_gather(ctx.rank)
    print("job {} rank {}: ranks {}, {} threads".format(os.environ.get("SLURM_JOB_ID"), ctx.rank, ranks,
                                                         torch.get_num_threads()), flush=True)
    cdist.barrier()
    cdist.cleanup()


if __name__ == "__main__":
    run_main(main)
