import argparse
import json
import os
import random
import re
import socket
import stat
import subprocess
import time

import pytest
import torch
import torch.multiprocessing as mp

from common.data.samplers import DistributedSampler, InferenceSampler
from common.runtime import distributed as cdist
from tests.faults import harness
from tests.tiny_vcr import ACCUMULATION_OPTS, CFG, ENTRY, LAUNCH_ENV, ROOT, checkpoint, output_folder


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
    assert cdist.slurm_env(dict(env, SLURM_JOB_ID="1234567"))["MASTER_PORT"] == "24567"
    assert cdist.slurm_env(dict(env, SLURM_JOB_ID="1234567", MASTER_PORT="31000"))["MASTER_PORT"] == "31000"
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


def _collectives_worker(rank, world_size, port, folder):
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
    _checkpoint_on_ranks(rank, world_size, folder)
    cdist.barrier()
    cdist.cleanup()


def _checkpoint_on_ranks(rank, world_size, folder):
    """Rank 0 alone writes; every rank's RNG goes into the file and comes back to that rank."""
    import types
    from common.checkpoint import checkpointer as ck
    torch.manual_seed(100 + rank)
    net = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    prefix = os.path.join(folder, "m")
    writes = []
    real = ck.write_checkpoint_file
    ck.write_checkpoint_file = lambda obj, path: (writes.append(path), real(obj, path))
    ck.save_checkpoint(ck.epoch_checkpoint_path(prefix, 0), net, opt)
    ck.write_checkpoint_file = real
    assert len(writes) == (1 if rank == 0 else 0)
    expected = torch.rand(3)  # the draws right after the save, different on every rank
    cdist.barrier()
    cfg = types.SimpleNamespace(RESUME=False, AUTO_RESUME=True, BEGIN_EPOCH=0, END_EPOCH=2)
    info = ck.resume_training(prefix, cfg, net, opt)
    assert info.path == ck.epoch_checkpoint_path(prefix, 0) and info.state["epoch"] == 1
    assert torch.equal(torch.rand(3), expected)
    assert len(ck.load_checkpoint_file(info.path)["rng"]) == world_size


def test_three_gloo_ranks_collectives_gather_and_checkpoint(tmp_path):
    spawn(_collectives_worker, 3, str(tmp_path))


# --- launch scripts, end to end on CPU: vcr/train_end2end.py on the tiny VCR data ------------------ #
FAULTS = os.path.join(ROOT, "tests", "fault_injection.py")


def _script(name):
    return os.path.join(ROOT, "scripts", name)


def _weights_distance(a, b):
    return sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in a if a[k].is_floating_point()) ** 0.5


def _dist_run_single(cwd, opts, model_dir=()):
    proc = subprocess.run([_script("dist_run_single.sh"), "2", ENTRY, CFG] + list(model_dir) + ["--opts"] + opts,
                          cwd=str(cwd), env=dict(os.environ, **LAUNCH_ENV), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]


def test_dist_run_single_two_cpu_ranks_accumulating(tmp_path, tiny_vcr):
    """2 ranks, batches of 1, k = 2, through dist_run_single.sh without MODEL_DIR (outputs under ./;
    the extra args reach the script)."""
    _dist_run_single(tmp_path, tiny_vcr.opts(ACCUMULATION_OPTS, TRAIN__BATCH_IMAGES=1, TRAIN__GRAD_ACCUMULATE_STEPS=2))
    final = checkpoint(tmp_path, 1)
    # 8 items on 2 ranks in batches of 1: 4 micro-batches per rank per epoch, k = 2 -> 2 steps per epoch
    assert (len(final["rng"]), final["train_state"]["global_step"]) == (2, 4)
    with open(os.path.join(output_folder(tmp_path), "run.json")) as f:
        record = json.load(f)
    assert (record["world_size"], record["strategy"]) == (2, "ddp")  # a one-process run: 'single' (test_run_record)


@pytest.mark.slow
def test_two_ranks_accumulating_equal_two_ranks_with_double_batches(tmp_path, tiny_vcr, tiny_init):
    """2 ranks x batches of 1 x k = 2 reach the weights of 2 ranks x batches of 2 (DDP syncs the last
    micro-batch of a group only). Each rank draws its own dropout masks (the image path's dropout 0.1 is
    fixed), the same in both layouts; the same runs on 1 rank would draw other masks."""
    runs = {}
    for batch, k in ((1, 2), (2, 1)):
        model_dir = tmp_path / "b{}k{}".format(batch, k)
        opts = tiny_vcr.opts(ACCUMULATION_OPTS, TRAIN__BATCH_IMAGES=batch, TRAIN__GRAD_ACCUMULATE_STEPS=k)
        _dist_run_single(tmp_path, opts, [str(model_dir)])
        runs[k] = checkpoint(model_dir, 1)["state_dict"]
    moved = _weights_distance(runs[1], checkpoint(tiny_init[0], 0)["state_dict"])
    assert moved > 1e-4 and _weights_distance(runs[2], runs[1]) < 1e-4 * moved


def test_failing_rank_stops_the_job_with_its_error(tmp_path, tiny_vcr):
    tic = time.time()
    proc = subprocess.run([_script("dist_run_single.sh"), "2", FAULTS, CFG, str(tmp_path), "--opts"] + tiny_vcr.opts(),
                          env=dict(os.environ, FAULT_FAIL_RANK="1", **LAUNCH_ENV), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode != 0
    assert "RuntimeError: injected failure on rank 1" in proc.stdout + proc.stderr
    assert time.time() - tic < 180  # ended by torchrun, not by a collective's timeout


@pytest.mark.slow
def test_dist_run_slurm_two_tasks(tmp_path, tiny_vcr):
    bin_dir = harness.fake_slurm(tmp_path)
    # PY_ARGS is a word list: an empty value is written as the literal "" (the config parser reads it as '')
    opts = " ".join(o or '""' for o in tiny_vcr.opts())
    env = dict(os.environ, PATH="{}:{}".format(bin_dir, os.environ["PATH"]), GPUS_PER_NODE="2", FAKE_GRES="gpu:8",
               MASTER_PORT=str(free_port()), PY_ARGS="--opts " + opts, **LAUNCH_ENV)
    proc = subprocess.run([_script("dist_run_slurm.sh"), "part", "job", ENTRY, CFG, str(tmp_path / "w"), "2"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    args = (bin_dir / "srun_args").read_text()
    assert "-p part --job-name=job --gres=gpu:2 --ntasks=2 --ntasks-per-node=2" in args
    assert "--kill-on-bad-exit=1" in args and args.rstrip().endswith("--slurm --dist --opts " + opts)
    final = checkpoint(tmp_path / "w", 0)
    # 16 items on 2 ranks in batches of 2, k = 2: 4 micro-batches per rank -> 2 steps
    assert (len(final["rng"]), final["train_state"]["global_step"]) == (2, 2)


def _job_on_a_free_port(taken):
    """A SLURM job id whose port (20000 + id % 10000) is free here and not in ``taken``."""
    while True:
        job = random.randrange(10 ** 6, 10 ** 7)
        port = 20000 + job % 10000
        with socket.socket() as s:
            if port not in taken and s.connect_ex(("127.0.0.1", port)) != 0:
                return job, port


def test_two_slurm_jobs_on_one_node_use_different_ports(tmp_path):
    """Two jobs of 2 tasks each, launched at once without MASTER_PORT, both form their groups (with
    one port for both, the second job's rank 0 could not bind it)."""
    jobs = []
    for _ in range(2):
        jobs.append(_job_on_a_free_port([port for _, port in jobs]))
    procs = []
    for (job, _), name in zip(jobs, "ab"):
        (tmp_path / name).mkdir()
        env = dict(os.environ, PATH="{}:{}".format(harness.fake_slurm(tmp_path / name), os.environ["PATH"]),
                   GPUS_PER_NODE="2", SLURM_JOB_ID=str(job), **LAUNCH_ENV)
        env.pop("MASTER_PORT", None)
        procs.append(subprocess.Popen(
            [_script("dist_run_slurm.sh"), "part", name, os.path.join(ROOT, "tests", "slurm_group.py"), CFG,
             str(tmp_path / name / "w"), "2"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    for (job, port), out in zip(jobs, outs):
        assert sorted(re.findall(r"job {} rank (\d): ranks \[0, 1\]".format(job), out)) == ["0", "1"], out
        # rank 0 says it (the other ranks' console shows errors only until the run's logging is set up)
        assert re.findall(r"process group: gloo, 2 process\(es\), master 127.0.0.1 port (\d+)", out) == [str(port)]
    assert jobs[0][1] != jobs[1][1] and all(20000 <= port < 30000 for _, port in jobs)


def _slurm_group(tmp_path, name, job, **env):
    """dist_run_slurm.sh running tests/slurm_group.py as SLURM job ``job`` on the fake srun (no NTASKS
    argument: the allocation's SLURM_NTASKS); returns the Popen (output in .stdout)."""
    (tmp_path / name).mkdir()
    full_env = dict(os.environ, PATH="{}:{}".format(harness.fake_slurm(tmp_path / name), os.environ["PATH"]),
                    SLURM_JOB_ID=str(job), SLURM_NTASKS="2", SLURM_CPUS_PER_TASK="1", **LAUNCH_ENV)
    for key in ("MASTER_PORT", "OMP_NUM_THREADS"):
        full_env.pop(key, None)
    full_env.update(env)
    return subprocess.Popen([_script("dist_run_slurm.sh"), "part", name, os.path.join(ROOT, "tests", "slurm_group.py"),
                             CFG, str(tmp_path / name / "w")], env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def test_slurm_launcher_on_cpu_and_gpu_partitions(tmp_path):
    # a CPU partition (sinfo lists no GRES): no --gres, the allocation's tasks and CPUs, 1 thread per task
    job, _ = _job_on_a_free_port([])
    proc = _slurm_group(tmp_path, "cpu", job)
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, out
    assert (tmp_path / "cpu" / "bin" / "srun_args").read_text().startswith(
        "srun -p part --job-name=cpu --ntasks=2 --ntasks-per-node=2 --cpus-per-task=1 --kill-on-bad-exit=1 ")
    assert sorted(re.findall(r"rank (\d): ranks \[0, 1\], 1 threads", out)) == ["0", "1"], out
    # a GPU partition: one GPU per task; the user's OMP_NUM_THREADS stays
    proc = _slurm_group(tmp_path, "gpu", job, FAKE_GRES="gpu:8(S:0-1)", OMP_NUM_THREADS="2")
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, out
    assert " --gres=gpu:2 --ntasks=2 " in (tmp_path / "gpu" / "bin" / "srun_args").read_text()
    assert sorted(re.findall(r"rank (\d): ranks \[0, 1\], 2 threads", out)) == ["0", "1"], out


def test_two_slurm_jobs_on_one_port_fail_cleanly_without_joining(tmp_path):
    """Job ids 10000 apart give one port: the second job's ranks must not join the first job's group
    (its rank 1 reaches the first job's store, which names another job) and end with one error line."""
    job, port = _job_on_a_free_port([])
    # the first job's rank 1 joins once the second job has ended: the second job's rank 1 reaches the store first
    first = _slurm_group(tmp_path, "first", job, GROUP_DELAY="1:{}".format(tmp_path / "go"))
    deadline = time.time() + 120
    while True:  # the first job's rank 0 serves the port
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        assert time.time() < deadline and first.poll() is None, first.communicate()[0]
        time.sleep(0.2)
    second = _slurm_group(tmp_path, "second", job + 10000)
    out2 = second.communicate(timeout=300)[0]
    (tmp_path / "go").touch()
    out1 = first.communicate(timeout=300)[0]
    assert first.returncode == 0, out1
    assert sorted(re.findall(r"job {} rank (\d): ranks \[0, 1\]".format(job), out1)) == ["0", "1"], out1
    assert second.returncode == 2, out2
    assert "ranks [" not in out2 and "Traceback" not in out2, out2
    errors = [line for line in out2.splitlines() if line.startswith("error:")]
    assert errors and all(str(port) in e and str(job + 10000) in e and "MASTER_PORT" in e for e in errors), out2


@pytest.mark.slow
def test_dist_run_multi_two_nodes_on_localhost(tmp_path, tiny_vcr):
    env = dict(os.environ, MASTER_PORT=str(free_port()), **LAUNCH_ENV)
    procs = [subprocess.Popen([_script("dist_run_multi.sh"), "2", str(node), "127.0.0.1", "1", ENTRY, CFG,
                               str(tmp_path / "m"), "--opts"] + tiny_vcr.opts(),
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for node in (0, 1)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[-3000:] for o in outs]
    final = checkpoint(tmp_path / "m", 0)
    assert (len(final["rng"]), final["train_state"]["global_step"]) == (2, 2)


def test_usage_errors():
    for name, n in (("dist_run_single.sh", 3), ("dist_run_multi.sh", 7), ("dist_run_slurm.sh", 5),
                    ("nondist_run.sh", 3)):
        proc = subprocess.run([_script(name)], capture_output=True, text=True)
        assert proc.returncode == 2 and "usage" in proc.stderr, name


def _assert_one_user_error(rc, out, warnings=1):
    """A launch of the paper config without its data and models ended: exit code 2, the message once, the
    config's warning ``warnings`` times (once: rank 0's), nothing of torchrun's (traceback, failure lines,
    thread banner) or of the other rank."""
    assert rc == 2, out[-3000:]
    assert [line for line in out.splitlines() if line.startswith("error:")] == [
        "error: the config names inputs that are not on this machine:"], out
    assert out.count("  DATASET.DATASET_PATH: data folder './data/vcr'") == 1, out
    assert out.count("GPUS = '0,1,2,3': devices come from the launcher") == warnings, out
    for noise in ("Traceback", "ChildFailedError", "exitcode", "closing signal", "OMP_NUM_THREADS"):
        assert noise not in out, (noise, out)


def test_user_mistake_through_dist_run_single_is_one_error(tmp_path):
    """The README's command on a machine without the VCR data: dist_run_single.sh, 2 ranks (each finds the
    inputs missing)."""
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)  # torchrun's banner about it stays away too
    proc = subprocess.run([_script("dist_run_single.sh"), "2", ENTRY, CFG, str(tmp_path / "m")], cwd=str(tmp_path),
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    _assert_one_user_error(proc.returncode, proc.stdout)


def test_user_mistake_through_dist_run_slurm_is_one_error(tmp_path):
    """The same through dist_run_slurm.sh: 2 tasks on the fake srun."""
    env = dict(os.environ, PATH="{}:{}".format(harness.fake_slurm(tmp_path), os.environ["PATH"]),
               MASTER_PORT=str(free_port()))
    proc = subprocess.run([_script("dist_run_slurm.sh"), "part", "job", ENTRY, CFG, str(tmp_path / "w"), "2"],
                          cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=300)
    _assert_one_user_error(proc.returncode, proc.stdout)
    assert os.listdir(tmp_path / "w") == []  # the launcher's folders of exit codes and errors are gone


@pytest.mark.slow
def test_user_mistake_through_dist_run_multi_is_one_error_per_node(tmp_path):
    env = dict(os.environ, MASTER_PORT=str(free_port()), **LAUNCH_ENV)
    procs = [subprocess.Popen([_script("dist_run_multi.sh"), "2", str(node), "127.0.0.1", "1", ENTRY, CFG,
                               str(tmp_path / "m")], cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for node in (0, 1)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for node, (proc, out) in enumerate(zip(procs, outs)):  # each node says its ranks' message once
        _assert_one_user_error(proc.returncode, out, warnings=1 if node == 0 else 0)
