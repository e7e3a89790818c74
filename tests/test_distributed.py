import argparse
import os
import socket
import stat

import pytest
import torch
import torch.multiprocessing as mp

from common import distributed as cdist
from common.data.samplers import DistributedSampler, InferenceSampler


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(fn, world_size, *args):
    """Run ``fn(rank, world_size, port, *args)`` on ``world_size`` gloo ranks; re-raise a rank's error."""
    mp.start_processes(fn, args=(world_size, free_port()) + args, nprocs=world_size, start_method="spawn")


def _set_env(rank, world_size, port):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)


def test_launcher_args_both_spellings(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    parser = cdist.add_launcher_args(argparse.ArgumentParser())
    assert parser.parse_args([]).local_rank == 3
    assert parser.parse_args(["--local-rank=1"]).local_rank == 1
    args = parser.parse_args(["--local_rank", "2", "--dist", "--slurm"])
    assert (args.local_rank, args.dist, args.slurm) == (2, True, True)


def test_slurm_env_with_scontrol(tmp_path, monkeypatch):
    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\n[ \"$1 $2 $3\" = 'show hostnames gpu[07-08]' ] && printf 'gpu07\\ngpu08\\n'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", "{}:{}".format(tmp_path, os.environ["PATH"]))
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODELIST": "gpu[07-08]"}
    assert cdist.slurm_env(env) == {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
                                    "MASTER_ADDR": "gpu07", "MASTER_PORT": "29500"}
    with pytest.raises(RuntimeError, match="SLURM_NODELIST not set"):
        cdist.slurm_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0"})


def test_too_many_gpus_says_how_many(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(RuntimeError, match="GPU 3 but this node has only 2 visible GPU"):
        cdist.select_device(3)


def test_init_without_launcher_vars(monkeypatch):
    for k in cdist.TORCHRUN_VARS:
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(RuntimeError, match="RANK, WORLD_SIZE.*torchrun"):
        cdist.init_distributed(True)
    ctx = cdist.init_distributed(False)
    assert (ctx.rank, ctx.world_size, ctx.distributed) == (0, 1, False)


def test_single_process_helpers():
    assert (cdist.get_rank(), cdist.get_world_size(), cdist.is_main_process()) == (0, 1, True)
    assert cdist.all_gather({"a": 1}) == [{"a": 1}]
    idx, pred = cdist.gather_predictions([2, 0, 2], torch.tensor([5, 3, 5]))
    assert idx.tolist() == [0, 2] and pred.tolist() == [3, 5]
    with pytest.raises(ValueError, match="2 indices for 3"):
        cdist.gather_predictions([0, 1], torch.zeros(3))


# 10 samples, label i % 3, prediction right except for samples 1, 4 and 9: accuracy 0.7
LABELS = torch.arange(10) % 3
PRED = LABELS.clone()
PRED[[1, 4, 9]] = (PRED[[1, 4, 9]] + 1) % 3


def _collectives_worker(rank, world_size, port):
    _set_env(rank, world_size, port)
    ctx = cdist.init_distributed(True, timeout_s=60)
    assert (ctx.rank, ctx.world_size, ctx.device.type) == (rank, world_size, "cpu")
    assert cdist.get_rank() == rank and cdist.is_main_process() == (rank == 0)
    assert cdist.all_gather(rank * 10) == [r * 10 for r in range(world_size)]
    assert cdist.broadcast_object("from {}".format(rank)) == "from 0"
    for sampler in (DistributedSampler(10, world_size, rank, seed=3), InferenceSampler(10, world_size, rank)):
        local = torch.tensor(list(sampler), dtype=torch.long)
        idx, pred = cdist.gather_predictions(local, PRED[local])
        assert idx.tolist() == list(range(10))
        acc = (pred == LABELS).float().mean().item()
        assert acc == pytest.approx(0.7)
    # the padded sampler alone would count samples twice
    local = torch.tensor(list(DistributedSampler(10, world_size, rank, seed=3)))
    dup = torch.cat(cdist.all_gather(local))
    assert len(dup) == 12
    cdist.barrier()
    cdist.cleanup()


def test_three_gloo_ranks_collectives_and_gather():
    spawn(_collectives_worker, 3)
