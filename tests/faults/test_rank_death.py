"""A rank dies (SIGKILL) in a 2-rank gloo run on the CPU, started by scripts/dist_run_single.sh: every
rank exits within a bounded time, and the launcher's message names the failed rank. No hang."""
import os
import re
import signal
import time

from tests.faults import harness

# Far below the process group's collective timeout (common.runtime.distributed.DEFAULT_TIMEOUT_S = 1800 s):
# the job must end because the death is noticed, not because a collective timed out.
BOUND_S = 90


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open("/proc/{}/stat".format(pid)) as f:  # a zombie has exited
        return f.read().split(")")[-1].split()[0] != "Z"


def test_dead_rank_ends_every_rank_with_its_name(tiny_cfg, tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    tic = time.time()
    rc, out, err = harness.run(tiny_cfg, tmp_path / "m", nprocs=2, timeout=BOUND_S + 60,
                               faults={"FAULT_DIE_RANK": 1, "FAULT_KILL_AT_BATCH": 3, "FAULT_PID_DIR": pids})
    elapsed = time.time() - tic
    log = out + err
    assert rc != 0 and elapsed < BOUND_S, (elapsed, log[-3000:])
    # torchrun's summary: the root cause is rank 1, killed by SIGKILL
    assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)", log), log[-3000:]
    assert re.search(r"exitcode\s*:\s*-{} ".format(int(signal.SIGKILL)), log), log[-3000:]
    workers = [int((pids / "{}.pid".format(r)).read_text()) for r in range(2)]
    assert not any(alive(pid) for pid in workers)
