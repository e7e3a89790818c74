"""Process group set-up from torchrun or SLURM variables, rank helpers and prediction gathering.

One process per device. With CUDA each rank uses GPU ``LOCAL_RANK`` and NCCL; without CUDA
the ranks run on the CPU with gloo, so the multi-process code path can be tested anywhere.
Every helper also works when no process group exists (a single process is rank 0 of 1).
"""
import argparse
import atexit
import datetime
import os
import socket
import subprocess
import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from common.errors import UserInputError
from common.runtime.logs import get_logger

# A collective that waits longer than this raises instead of hanging forever. Long enough for
# a rank-0-only step (saving a large checkpoint, evaluating) between two collectives.
DEFAULT_TIMEOUT_S = 1800
DEFAULT_MASTER_PORT = "29500"
# Under SLURM without MASTER_PORT the port is SLURM_PORT_BASE + SLURM_JOB_ID % SLURM_PORT_SPAN, in
# [20000, 30000): below Linux's ephemeral ports (32768+), and two jobs sharing a node get different
# ports unless their ids differ by a multiple of 10000.
SLURM_PORT_BASE, SLURM_PORT_SPAN = 20000, 10000
# The key under which rank 0 stores its SLURM job id in the rendezvous store.
JOB_KEY = "slurm_job_id"
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
# The exit code of a rank whose collective failed because a peer is gone (common.engine.train_net).
PEER_LOST_EXIT_CODE = 4
# Every rank of a group bumps its counter in the rendezvous store every HEARTBEAT_S s (a daemon thread): after a
# collective failed, a rank still blocked in a collective of its own is told from a lost one. A rank whose
# counter stands still for CHECK_IN_S s, and that has not stopped on the failure itself, is named as lost
# (:func:`report_lost_peers`).
HEARTBEAT_S = 1
CHECK_IN_S = 5


def add_launcher_args(parser):
    """Add ``--dist``, ``--slurm`` and ``--local-rank`` / ``--local_rank`` to an argparse parser.

    torch.distributed.launch passes ``--local-rank=N`` (older versions ``--local_rank``);
    torchrun passes nothing and sets ``LOCAL_RANK``, which is the default here.
    """
    parser.add_argument("--dist", action="store_true", help="distributed training (run through torchrun or srun)")
    parser.add_argument("--slurm", action="store_true", help="read rank and world size from SLURM variables")
    parser.add_argument("--local-rank", "--local_rank", dest="local_rank", type=int,
                        default=int(os.environ.get("LOCAL_RANK", 0)), help=argparse.SUPPRESS)
    return parser


@dataclass
class DistContext:
    """Where this process sits: ``rank`` of ``world_size``, ``local_rank`` on its node, its ``device``."""
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def distributed(self):
        return self.world_size > 1 or dist.is_initialized()


def slurm_env(environ=None, hostnames=None):
    """torchrun-style variables from a SLURM task's environment.

    Args:
        environ (dict): defaults to ``os.environ``; needs SLURM_PROCID, SLURM_NTASKS,
            SLURM_LOCALID and SLURM_NODELIST (set by ``srun``).
        hostnames (callable): nodelist -> list of host names; defaults to ``scontrol show hostnames``.
    Returns:
        dict with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR (first node), MASTER_PORT: ``MASTER_PORT``
        if set, else derived from SLURM_JOB_ID (:func:`slurm_job_port`), else 29500.
    Raises:
        RuntimeError: a SLURM variable is missing (not started by ``srun``).
    """
    environ = os.environ if environ is None else environ
    needed = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODELIST")
    missing = [k for k in needed if k not in environ]
    if missing:
        raise RuntimeError("--slurm given but {} not set: start the script with srun "
                           "(scripts/dist_run_slurm.sh)".format(", ".join(missing)))
    hostnames = hostnames or _scontrol_hostnames
    return {
        "RANK": environ["SLURM_PROCID"],
        "WORLD_SIZE": environ["SLURM_NTASKS"],
        "LOCAL_RANK": environ["SLURM_LOCALID"],
        "MASTER_ADDR": hostnames(environ["SLURM_NODELIST"])[0],
        "MASTER_PORT": environ.get("MASTER_PORT") or slurm_job_port(environ.get("SLURM_JOB_ID")),
    }


def slurm_job_port(job_id):
    """The rendezvous port of SLURM job ``job_id`` (str of digits, or None): ``SLURM_PORT_BASE +
    job_id % SLURM_PORT_SPAN`` as a str, in [20000, 30000); 29500 without a job id."""
    if not job_id:
        return DEFAULT_MASTER_PORT
    return str(SLURM_PORT_BASE + int(job_id) % SLURM_PORT_SPAN)


def job_store(rank, world_size, timeout):
    """The rendezvous store of a SLURM job: a ``TCPStore`` on MASTER_ADDR:MASTER_PORT that rank 0 serves and
    tags with SLURM_JOB_ID; every other rank checks the tag, so two jobs given one port never form one group.

    Raises:
        common.errors.UserInputError: the port is taken (rank 0), or its store belongs to another job (other
            ranks); the message names the port, both jobs and MASTER_PORT as the way out.
    """
    addr, port, job = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), os.environ.get("SLURM_JOB_ID", "")
    fix = "give this job another port: MASTER_PORT=<a free port in [1024, 32768)>"
    try:
        store = dist.TCPStore(addr, port, world_size, is_master=rank == 0, timeout=timeout, wait_for_workers=False)
    except dist.DistNetworkError as e:
        if rank == 0 and "address already in use" in str(e).lower():
            raise UserInputError("port {} on {} is taken (by another job on this node?), so SLURM job {} cannot "
                                 "start its process group there: {}".format(port, addr, job, fix)) from None
        raise
    if rank == 0:
        store.set(JOB_KEY, job)
    else:
        owner = store.get(JOB_KEY).decode()
        if owner != job:
            raise UserInputError("rank {} of SLURM job {} reached the process group of SLURM job {} at {}:{} (both "
                                 "jobs use port {}): {}".format(rank, job, owner, addr, port, port, fix))
    return store


def _scontrol_hostnames(nodelist):
    out = subprocess.check_output(["scontrol", "show", "hostnames", nodelist], text=True)
    return out.split()


def select_device(local_rank):
    """The device of a rank: ``cuda:local_rank`` when CUDA is available, else the CPU.

    Raises:
        RuntimeError: ``local_rank`` names a GPU this node does not have; the message gives the
            number of visible GPUs.
    """
    if not torch.cuda.is_available():
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise RuntimeError("local rank {} needs GPU {} but this node has only {} visible GPU(s) "
                           "(CUDA_VISIBLE_DEVICES={!r}): start at most {} process(es) per node".format(
                               local_rank, local_rank, count, os.environ.get("CUDA_VISIBLE_DEVICES"), count))
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def init_distributed(distributed=True, slurm=False, timeout_s=DEFAULT_TIMEOUT_S):
    """Create the default process group (if ``distributed``) and pick this rank's device.

    Rank and world size come from torchrun's variables, or from SLURM's with ``slurm=True``
    (copied into the torchrun names so that later code reads one set; see :func:`slurm_env` for
    the port; under SLURM the ranks meet in :func:`job_store`). NCCL with CUDA, gloo without; the master
    address and port are logged. Collectives time out after ``timeout_s`` seconds, so a rank whose peer died
    raises instead of hanging; torchrun then stops the remaining ranks and reports the first
    failure (decorate ``main`` with ``torch.distributed.elastic.multiprocessing.errors.record``
    to get its traceback).

    Returns:
        DistContext. Without ``distributed``: rank 0 of 1 on GPU 0 if there is one, else CPU.
    Raises:
        RuntimeError: launcher variables missing, or more processes per node than GPUs.
    """
    if not distributed:
        return DistContext(device=select_device(0))
    if slurm:
        os.environ.update(slurm_env())
    missing = [k for k in TORCHRUN_VARS if k not in os.environ]
    if missing:
        raise RuntimeError("--dist given but {} not set: launch with torchrun "
                           "(scripts/dist_run_single.sh / dist_run_multi.sh) or srun with --slurm".format(
                               ", ".join(missing)))
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    device = select_device(local_rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl":
        # Abort a collective that a dead peer will never join, instead of blocking forever.
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    if not dist.is_initialized():
        # Logged before the group forms: a port already taken (EADDRINUSE) is then named in the log.
        get_logger("distributed").info("process group: %s, %d process(es), master %s port %s", backend,
                                       world_size, os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"])
        timeout = datetime.timedelta(seconds=timeout_s)
        # Under torchrun the ranks meet in its agent's store (env://); under SLURM in a store of our own,
        # which rank 0 tags with its job id.
        rendezvous = {"store": job_store(rank, world_size, timeout)} if slurm else {"init_method": "env://"}
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size, timeout=timeout,
                                device_id=device if backend == "nccl" else None, **rendezvous)
        # each rank's host and heartbeat, for naming a lost peer (report_lost_peers)
        store = dist.distributed_c10d._get_default_store()
        store.set("host/{}".format(rank), socket.gethostname())
        if world_size > 1:
            _start_heartbeat(store, rank)
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


def is_peer_failure(error):
    """True when ``error`` (an exception raised by a collective) says a peer rank is gone or silent: a gloo
    connection closed or reset, a collective timed out, an NCCL error; False without a process group."""
    if not (dist.is_available() and dist.is_initialized() and get_world_size() > 1):
        return False
    return isinstance(error, dist.DistError) or "/gloo/" in str(error)


_heartbeat = None  # (thread, stop event) of this process's heartbeat, stopped by cleanup()


def _start_heartbeat(store, rank):
    """Bump ``beat/<rank>`` in ``store`` every :data:`HEARTBEAT_S` s in a daemon thread, until :func:`cleanup` or
    until the store fails."""
    global _heartbeat
    stop = threading.Event()

    def beat():
        key = "beat/{}".format(rank)
        try:
            while True:
                store.add(key, 1)
                if stop.wait(HEARTBEAT_S):
                    return
        except Exception:  # the store (or its host) is gone: there is nobody left to tell
            return
    thread = threading.Thread(target=beat, name="heartbeat", daemon=True)
    thread.start()
    _heartbeat = thread, stop
    # also on an exit that skips cleanup() (an error before training's try): a thread still inside the store's
    # C++ client when the interpreter ends aborts the process
    atexit.register(_stop_heartbeat)


def _stop_heartbeat():
    """Stop this process's heartbeat thread and wait for it (at most CHECK_IN_S s); a no-op without one."""
    global _heartbeat
    if _heartbeat is not None:
        thread, stop = _heartbeat
        stop.set()
        thread.join(CHECK_IN_S)
        _heartbeat = None


def report_lost_peers(error, logger):
    """After a collective failed (:func:`is_peer_failure`), log one ``error:`` line naming the lost peers.

    This rank marks itself as stopped in the rendezvous store (on MASTER_ADDR), then watches the ranks'
    heartbeats for :data:`CHECK_IN_S` s: a rank whose heartbeat stood still and that did not stop on the failure
    itself is lost, named with its host. A live rank still blocked in a collective of its own (it fails once its
    peers exit) is not named. A rank that cannot reach the store names MASTER_ADDR (rank 0's host) instead.

    Args:
        error (Exception): the collective's error; its first line ends the message.
        logger (logging.Logger): where the line goes.
    Returns:
        list of int: the lost ranks (empty when the store is lost).
    """
    rank, world_size = get_rank(), get_world_size()
    host = socket.gethostname()
    reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
    reason = reason.split("] ", 1)[-1][:200]  # without gloo's source location
    store = dist.distributed_c10d._get_default_store()
    found = {}

    def watch():
        store.set_timeout(datetime.timedelta(seconds=CHECK_IN_S))
        store.set("stopped/{}".format(rank), host)
        others = [r for r in range(world_size) if r != rank]
        before = {r: store.add("beat/{}".format(r), 0) for r in others}
        time.sleep(CHECK_IN_S)
        lost = [r for r in others if store.add("beat/{}".format(r), 0) == before[r]
                and not store.check(["stopped/{}".format(r)])]
        found["lost"] = lost, [store.get("host/{}".format(r)).decode() for r in lost]

    # in a thread: a store behind a dead link blocks in TCP retransmits (minutes), not in the store's timeout
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    thread.join(2 * CHECK_IN_S + 2)
    if "lost" in found:
        lost, hosts = found["lost"]
    else:  # the store's host is the one lost (or unreachable from here)
        logger.error("error: lost peer: the rendezvous store at %s:%s (rank 0's host) is unreachable from rank "
                     "%d on %s; the collective failed: %s", os.environ.get("MASTER_ADDR"),
                     os.environ.get("MASTER_PORT"), rank, host, reason)
        return []
    names = ", ".join("rank {} on {}".format(r, h) for r, h in zip(lost, hosts)) or "none named (every rank is alive)"
    logger.error("error: lost peer: %s; rank %d on %s stops: the collective failed: %s", names, rank, host, reason)
    return lost


def cleanup():
    """Stop the heartbeat (before the store goes), then destroy the default process group if there is one."""
    _stop_heartbeat()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def get_rank():
    """Rank of this process in the default group (0 without one)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def get_world_size():
    """Number of processes in the default group (1 without one)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def is_main_process():
    """True on rank 0: the only rank that writes checkpoints, logs and tensorboard events."""
    return get_rank() == 0


def barrier():
    """Wait for every rank (no-op in a single process)."""
    if get_world_size() > 1:
        dist.barrier()


def any_rank(flag: bool) -> bool:
    """True on every rank when ``flag`` is True on at least one (a MAX all-reduce of one int, on the
    GPU under NCCL); ``flag`` itself in a single process."""
    if get_world_size() == 1:
        return bool(flag)
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    value = torch.tensor([int(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def all_gather(obj):
    """List of every rank's picklable ``obj``, indexed by rank (``[obj]`` in a single process)."""
    if get_world_size() == 1:
        return [obj]
    out = [None] * get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj, src=0):
    """Rank ``src``'s picklable ``obj`` on every rank."""
    if get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def gather_predictions(indices, predictions):
    """Every rank's predictions, one per dataset sample, ordered by sample index.

    Samplers that pad (repeat samples so that ranks get equal shares) make some samples appear
    on two ranks; keeping one prediction per index makes a metric count each sample once, so
    10 samples on 3 ranks give the single-process value.

    Args:
        indices (LongTensor [N] or list of int): dataset index of each local prediction.
        predictions (Tensor [N, ...]): local predictions (any dtype; moved to CPU).
    Returns:
        (indices LongTensor [M], predictions Tensor [M, ...]) on every rank, M = number of
        distinct indices, sorted by index.
    Raises:
        ValueError: ``indices`` and ``predictions`` differ in length.
    """
    indices = torch.as_tensor(indices, dtype=torch.long).cpu().reshape(-1)
    predictions = predictions.detach().cpu()
    if len(indices) != len(predictions):
        raise ValueError("got {} indices for {} predictions".format(len(indices), len(predictions)))
    parts = all_gather((indices, predictions))
    all_idx = torch.cat([p[0] for p in parts])
    all_pred = torch.cat([p[1] for p in parts])
    unique, inverse = torch.unique(all_idx, sorted=True, return_inverse=True)
    # position of the first occurrence of each unique index
    first = torch.full((len(unique),), len(all_idx), dtype=torch.long)
    first.scatter_reduce_(0, inverse, torch.arange(len(all_idx)), reduce="amin")
    return unique, all_pred[first]
