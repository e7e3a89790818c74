"""scripts/dist_run_slurm.sh on a real SLURM of one and of two nodes (scripts/slurm_local.sh, the two nodes in
network namespaces; slow, --runslow).

Jobs of 2 tasks per node of the tiny task with 2 DataLoader workers each, submitted with sbatch as docs/slurm.md
shows, stopped the ways a cluster stops them: ``scancel --signal=USR1`` / ``--signal=TERM``,
``scontrol requeue``, ``scancel`` (saved, not requeued), a time limit with ``--signal=USR1@60`` and
``--signal=B:USR1@60``, and two jobs at once. Each job must come back exactly once per stop, resume at the step
where it stopped, and end bit for bit where an uninterrupted job ends. A requeued job waits ~2 min before SLURM
starts it again; the tests start it at once (``scontrol update StartTime=now``).

On the two nodes only: ``scripts/dist_run_multi.sh`` (torchrun, no SLURM) run once in each node's namespace ends
where the SLURM job ends; and the faults between nodes of docs/slurm.md: a rank of the second node killed, the
second node's link set down mid-step. Each job ends within its bound, every surviving rank names the lost peer in
one line, and the job resubmitted with TRAIN.AUTO_RESUME ends bit for bit where an uninterrupted job ends.
"""
import json
import os
import re
import shlex
import subprocess
import time

import pytest

from common.runtime import distributed as cdist
from tests.conftest import ROOT
from tests.faults import harness, tiny_task
from tests.faults.tracker_stores import default_store, mlflow_rows, mlflow_runs

pytestmark = pytest.mark.slow

SLURM_LOCAL = os.path.join(ROOT, "scripts", "slurm_local.sh")
LAUNCHER = os.path.join(ROOT, "scripts", "dist_run_slurm.sh")
OPTS = ("NUM_WORKERS_PER_GPU", 2, "TRAIN.CHECKPOINT_STEPS", 0)
DONE = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


TASKS_PER_NODE = 2


@pytest.fixture(scope="module", params=[1, 2], ids=["1node", "2nodes"])
def cluster(request):
    """The environment of a running cluster of ``request.param`` node(s) (SLURM_CONF and SLURM_LOCAL_NODES set),
    each node 4 CPUs, so that two jobs of 2 tasks per node run at once; started and stopped here unless one of
    that size runs already. Skips, saying why, when SLURM cannot be installed or namespaces cannot be made."""
    nodes = request.param
    env = dict(os.environ, SLURM_LOCAL_CPUS="4")
    status = subprocess.run([SLURM_LOCAL, "status"], env=env, capture_output=True, text=True)
    started = "running: {} node(s)".format(nodes) not in status.stdout
    if started:
        subprocess.run([SLURM_LOCAL, "stop"], env=env, capture_output=True, timeout=120)
        proc = subprocess.run([SLURM_LOCAL, "start", "--nodes", str(nodes)], env=env, capture_output=True,
                              text=True, timeout=900)
        if proc.returncode != 0:
            reason = "no local SLURM cluster of {} node(s): ".format(nodes) + (
                proc.stderr.strip().splitlines() or ["?"])[-1]
            print(reason)
            pytest.skip(reason)
    env["SLURM_CONF"] = os.path.join(env.get("SLURM_LOCAL_DIR", "/tmp/slurm_local"), "slurm.conf")
    env["SLURM_LOCAL_NODES"] = str(nodes)
    yield env
    if started:
        subprocess.run([SLURM_LOCAL, "stop"], env=env, timeout=120)


class Job:
    """One sbatch job of the tiny task through the launcher; its output (all runs) in ``log``."""

    def __init__(self, cluster, folder, name, sbatch_args=(), env=None, opts=(), log="job.log"):
        tiny_task.write_config(folder)
        self.cluster, self.work, self.log = cluster, folder / "work", str(folder / log)
        nodes = int(cluster["SLURM_LOCAL_NODES"])
        command = [LAUNCHER, "debug", name, tiny_task.SCRIPT, str(folder / "tiny.yaml"), str(self.work),
                   str(nodes * TASKS_PER_NODE), "--opts"] + [str(o) for o in OPTS + tuple(opts)]
        # exec: the launcher is then the batch shell, which --signal=B:... signals
        sbatch = ["sbatch", "--parsable", "--requeue", "--nodes={}".format(nodes),
                  "--ntasks-per-node={}".format(TASKS_PER_NODE), "--cpus-per-task=1", "--open-mode=append",
                  "-o", self.log, "-J", name, *sbatch_args, "--wrap", "exec " + shlex.join(command)]
        job_env = dict(cluster, **(env or {}))
        job_env.pop("MASTER_PORT", None)
        self.id = subprocess.run(sbatch, env=job_env, capture_output=True, text=True, check=True).stdout.strip()
        self.started = time.time()

    def info(self):
        out = subprocess.run(["scontrol", "show", "job", "-o", self.id], env=self.cluster, capture_output=True,
                             text=True).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def output(self):
        return open(self.log).read() if os.path.exists(self.log) else ""

    def wait_for(self, text, timeout=300):
        """Wait until the job's output shows ``text``."""
        deadline = time.time() + timeout
        while text not in self.output():
            assert time.time() < deadline, "no {!r} within {} s:\n{}".format(text, timeout, self.output()[-3000:])
            assert self.info().get("JobState") not in DONE, self.output()[-3000:]
            time.sleep(0.5)

    def control(self, *args):
        subprocess.run(list(args) + [self.id], env=self.cluster, check=True)

    def finish(self, timeout=600):
        """Wait for the job's end, starting each requeued run at once: ``(JobState, Restarts, seconds)``."""
        deadline = time.time() + timeout
        while True:
            info = self.info()
            if info.get("JobState") in DONE:
                return info["JobState"], int(info["Restarts"]), time.time() - self.started
            if info.get("JobState") == "PENDING" and info.get("Reason") == "BeginTime":
                subprocess.run(["scontrol", "update", "JobId=" + self.id, "StartTime=now"], env=self.cluster)
            assert time.time() < deadline, self.output()[-3000:]
            time.sleep(1)

    def final_state(self):
        return harness.training_state(os.path.join(harness.out_dir(self.work), harness.FINAL))


@pytest.fixture(scope="module")
def clean(cluster, tmp_path_factory):
    """The final state of an uninterrupted job (2 tasks per node)."""
    job = Job(cluster, tmp_path_factory.mktemp("clean"), "clean")
    state, restarts, seconds = job.finish()
    assert (state, restarts) == ("COMPLETED", 0), job.output()[-3000:]
    print("uninterrupted job: {:.0f} s".format(seconds))
    return job.final_state()


@pytest.fixture(scope="module")
def clean_of(cluster, clean, tmp_path_factory):
    """``clean_of(strategy)``: the final state of an uninterrupted 2-task job of TRAIN.STRATEGY ``strategy``."""
    states = {"ddp": clean}

    def get(strategy):
        if strategy not in states:
            job = Job(cluster, tmp_path_factory.mktemp("clean_" + strategy), "clean", opts=("TRAIN.STRATEGY", strategy))
            state, restarts, _ = job.finish()
            assert (state, restarts) == ("COMPLETED", 0), job.output()[-3000:]
            states[strategy] = job.final_state()
        return states[strategy]
    return get


def check_resumed_exactly(job, clean, stops=1):
    """``stops`` preemptions, each resumed at the step where it stopped, and the uninterrupted job's end."""
    out = job.output()
    stopped = re.findall(r"preempted: stopped at epoch (\d+), batch (\d+)", out)
    resumed = re.findall(r"Resumed from \S+: epoch (\d+), batch (\d+)", out)
    assert len(stopped) == stops and resumed == stopped, out[-3000:]
    assert "is killed by signal" not in out and "exited unexpectedly" not in out
    harness.assert_same(job.final_state(), clean)


SLOW = {"FAULT_SLOW_BATCH_S": "0.5"}  # the first run's 24 micro-batches take 12 s or more: time to signal it


@pytest.mark.parametrize("stop,strategy", [(["scancel", "--signal=USR1"], "ddp"), (["scancel", "--signal=TERM"], "ddp"),
                                           (["scontrol", "requeue"], "ddp"), (["scancel", "--signal=USR1"], "fsdp")],
                         ids=["usr1", "term", "requeue", "usr1-fsdp"])
def test_a_stopped_job_is_requeued_once_and_ends_as_an_uninterrupted_one(cluster, clean_of, tmp_path, stop, strategy):
    """fsdp: sharded checkpoint folders, the preemption checkpoint too."""
    clean = clean_of(strategy)
    job = Job(cluster, tmp_path, "stop", env=SLOW, opts=("TRAIN.STRATEGY", strategy))
    job.wait_for("Epoch[0] Batch [")
    job.control(*stop)
    state, restarts, seconds = job.finish()
    print("{}: {} after {} requeue(s), {:.0f} s".format(" ".join(stop), state, restarts, seconds))
    assert (state, restarts) == ("COMPLETED", 1), job.output()[-3000:]
    check_resumed_exactly(job, clean)
    expected = "already" if stop[0] == "scontrol" else "requeueing job"
    assert expected in job.output()


def test_a_cancelled_job_saves_its_step_and_is_not_requeued(cluster, tmp_path):
    job = Job(cluster, tmp_path, "cancel", env=SLOW)
    job.wait_for("Epoch[0] Batch [")
    job.control("scancel")
    state, restarts, seconds = job.finish()
    print("scancel: {} after {} requeue(s), {:.0f} s".format(state, restarts, seconds))
    assert (state, restarts) == ("CANCELLED", 0), job.output()[-3000:]
    assert "job {} was cancelled (scancel), so it is not requeued".format(job.id) in job.output()
    assert [name for name in harness.checkpoint_names(job.work) if "-b" in name], job.output()[-3000:]


@pytest.mark.parametrize("signal_option", ["--signal=USR1@60", "--signal=B:USR1@60"])
def test_a_time_limit_with_a_warning_signal(cluster, clean, tmp_path, signal_option):
    # 2 min, the signal 60 s before the end (SLURM checks every 30 s: 60 to 90 s into the job); the first
    # run trains from ~20 s for 96 s
    job = Job(cluster, tmp_path, "limit", sbatch_args=["--time=2", signal_option], env={"FAULT_SLOW_BATCH_S": "4"})
    state, restarts, seconds = job.finish()
    print("{}: {} after {} requeue(s), {:.0f} s".format(signal_option, state, restarts, seconds))
    assert (state, restarts) == ("COMPLETED", 1), job.output()[-3000:]
    check_resumed_exactly(job, clean)
    assert "SIGUSR1 received" in job.output()


def test_two_jobs_at_once_stopped_and_resumed(cluster, clean, tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    jobs = [Job(cluster, tmp_path / name, name, env=SLOW) for name in ("a", "b")]
    for job in jobs:
        job.wait_for("Epoch[0] Batch [")
    for job in jobs:
        job.control("scancel", "--signal=TERM")
    ports = []
    for job in jobs:
        state, restarts, seconds = job.finish()
        print("job {}: {} after {} requeue(s), {:.0f} s".format(job.id, state, restarts, seconds))
        assert (state, restarts) == ("COMPLETED", 1), job.output()[-3000:]
        check_resumed_exactly(job, clean)
        ports.append(set(re.findall(r"master \S+ port (\d+)", job.output())))
    assert len(ports[0]) == len(ports[1]) == 1 and ports[0] != ports[1]


def test_a_preempted_job_continues_one_mlflow_run_with_every_step(cluster, tmp_path):
    """REPORT_TO mlflow (the SQLite store in the run folder), USR1 preemption and requeue: one MLflow run, the
    requeued run continuing the one of the checkpoint, whose metric history holds every step of an uninterrupted
    job with its value (the clock's figures and the epoch's running training metrics aside: a resumed run
    measures its own, and restarts the running means mid-epoch); both jobs end bit for bit alike.
    One node shows it (only rank 0 reports)."""
    if cluster["SLURM_LOCAL_NODES"] != "1":
        pytest.skip("shown on one node")
    report = ("REPORT_TO", "['tensorboard','mlflow']")
    jobs = {}
    for name, env in (("clean", None), ("stop", SLOW)):
        (tmp_path / name).mkdir()
        jobs[name] = Job(cluster, tmp_path / name, "mlflow_" + name, env=env, opts=report)
    jobs["stop"].wait_for("Epoch[0] Batch [3]")
    jobs["stop"].control("scancel", "--signal=USR1")
    runs, rows = {}, {}
    for name, job in jobs.items():
        state, restarts, seconds = job.finish()
        print("mlflow {} job: {} after {} requeue(s), {:.0f} s".format(name, state, restarts, seconds))
        assert (state, restarts) == ("COMPLETED", int(name == "stop")), job.output()[-3000:]
        folder = harness.out_dir(job.work)
        (runs[name],), store = mlflow_runs(default_store(folder))
        with open(os.path.join(folder, "run.json")) as f:
            assert json.load(f)["trackers"]["mlflow"]["run_id"] == runs[name].info.run_id
        rows[name] = mlflow_rows(store, runs[name].info.run_id)
    assert re.search(r"Resumed from \S+: epoch \d+, batch [1-9]", jobs["stop"].output()), jobs["stop"].output()[-3000:]
    states = {name: job.final_state() for name, job in jobs.items()}
    for name, state in states.items():
        assert state.pop("trackers") == {"mlflow": runs[name].info.run_id}
    harness.assert_same(states["stop"], states["clean"])  # one computation resumed: bit for bit
    clean, stopped = rows["clean"], rows["stop"]
    assert sorted(stopped) == sorted(clean) and len(clean) >= 12
    for step, figures in clean.items():
        assert sorted(stopped[step]) == sorted(figures), step
        for key, value in figures.items():
            if key.startswith(("Speed/", "Time/", "Memory/")) or key.startswith("Train-") and key != "Train-Loss":
                continue  # the clock's figures; an epoch's running training metric restarts at a mid-epoch resume
            assert stopped[step][key] == value, (step, key, stopped[step][key], value)


# --------------------------------------------------------------------------------------- two nodes only
TWO_NODES = pytest.mark.parametrize("cluster", [2], indirect=True, ids=["2nodes"])
NODE1_NETNS = "slurm_node1"  # scripts/slurm_local.sh: node I is the namespace slurm_nodeI, its link eth0


def in_node(i, command, **popen_args):
    """Start ``command`` on node ``i``: in its network namespace, under its host name, as slurmd runs there."""
    return subprocess.Popen(["nsenter", "--net=/run/netns/slurm_node{}".format(i), "unshare", "--uts", "sh", "-c",
                             'hostname node{} && exec "$@"'.format(i), "sh"] + command, **popen_args)


def lost_peers(out):
    """``{reporting rank: (the lost peers it named, why its collective failed)}`` from the job's lost-peer lines;
    a rank reporting twice fails."""
    found = {}
    for named, rank, why in re.findall(r"error: lost peer: (.*); rank (\d+) on \S+ stops: the collective failed: (.*)",
                                       out):
        assert int(rank) not in found, "rank {} reported twice:\n{}".format(rank, out[-3000:])
        found[int(rank)] = named, why
    return found


def resubmit_resumes_exactly(cluster, folder, clean):
    """Resubmit the job of ``folder`` (TRAIN.AUTO_RESUME, as the tiny config has it): it resumes from the last
    checkpoint the failed job saved and ends bit for bit as the uninterrupted job."""
    saved = harness.checkpoint_names(folder / "work")
    assert saved, "the failed job saved no checkpoint"
    job = Job(cluster, folder, "again", opts=("TRAIN.CHECKPOINT_STEPS", 2), log="again.log")
    state, restarts, _ = job.finish()
    assert (state, restarts) == ("COMPLETED", 0), job.output()[-3000:]
    assert re.search(r"Resumed from \S+: epoch [1-9]", job.output()), job.output()[-3000:]
    harness.assert_same(job.final_state(), clean)  # one computation resumed: bit for bit


@TWO_NODES
def test_dist_run_multi_across_the_two_nodes_ends_as_the_slurm_job(cluster, clean, tmp_path):
    """torchrun on node0 and on node1 (2 ranks each, master node0 by name): the 4-rank SLURM job's end."""
    tiny_task.write_config(tmp_path)
    command = [os.path.join(ROOT, "scripts", "dist_run_multi.sh"), "2", None, "node0", str(TASKS_PER_NODE),
               tiny_task.SCRIPT, str(tmp_path / "tiny.yaml"), str(tmp_path / "work"), "--opts"] + [str(o) for o in OPTS]
    env = dict(os.environ, MASTER_PORT="29610", OMP_NUM_THREADS="1")
    procs = [in_node(i, command[:2] + [str(i)] + command[3:], env=env, stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT, text=True) for i in (0, 1)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[-3000:] for o in outs]
    assert "process group: gloo, 4 process(es), master node0 port 29610" in outs[0], outs[0][-3000:]
    harness.assert_same(harness.training_state(os.path.join(harness.out_dir(tmp_path / "work"), harness.FINAL)),
                        clean)  # the same 4-rank computation under another launcher: bit for bit


@TWO_NODES
def test_a_rank_killed_on_the_second_node_is_named_and_the_job_resumes(cluster, clean, tmp_path):
    # rank 2 (node1's first) is killed at its 7th micro-batch (epoch 1), after the epoch-0 checkpoints
    job = Job(cluster, tmp_path, "kill", env={"FAULT_DIE_RANK": "2", "FAULT_KILL_AT_BATCH": "7"},
              opts=("TRAIN.CHECKPOINT_STEPS", 2))
    state, restarts, seconds = job.finish()
    print("SIGKILL of rank 2 on node1: {} in {:.0f} s".format(state, seconds))
    assert (state, restarts) == ("FAILED", 0), job.output()[-3000:]
    assert seconds < 120, seconds
    reports = lost_peers(job.output())
    assert sorted(reports) == [0, 1, 3], job.output()[-3000:]  # every surviving rank, once
    assert {named for named, _ in reports.values()} == {"rank 2 on node1"}, reports
    resubmit_resumes_exactly(cluster, tmp_path, clean)


@TWO_NODES
def test_the_second_nodes_link_down_mid_step_ends_the_job_within_its_bound(cluster, clean, tmp_path):
    """DIST_TIMEOUT_S bounds a silent node: node0's ranks name both of node1's after DIST_TIMEOUT_S + CHECK_IN_S;
    STEP_END_S later the launcher ends srun, which cannot learn that node1's tasks ended."""
    timeout_s, step_end_s = 20, 10
    job = Job(cluster, tmp_path, "link", env={"FAULT_SLOW_BATCH_S": "0.5", "STEP_END_S": str(step_end_s)},
              opts=("TRAIN.CHECKPOINT_STEPS", 2, "DIST_TIMEOUT_S", timeout_s))
    job.wait_for("Epoch[1] Batch [0]")
    try:
        subprocess.run(["ip", "-n", NODE1_NETNS, "link", "set", "eth0", "down"], check=True)
        tic = time.time()
        job.wait_for("error: srun has not ended the step", timeout=timeout_s + step_end_s + 60)
        seconds = time.time() - tic
        reports = lost_peers(job.output())
        print("link of node1 down: node0's ranks named it, the launcher ended the step after {:.0f} s".format(seconds))
    finally:
        subprocess.run(["ip", "-n", NODE1_NETNS, "link", "set", "eth0", "up"], check=True)
    assert seconds < timeout_s + cdist.CHECK_IN_S + step_end_s + 15, seconds
    # node0's ranks (node1's cannot reach the store on node0, nor send their lines to srun until the link is up)
    assert sorted(reports)[:2] == [0, 1], job.output()[-3000:]
    for rank in (0, 1):
        named, why = reports[rank]
        assert named == "rank 2 on node1, rank 3 on node1", reports
        assert re.match(r"Timed out waiting {}ms for (send|recv) operation".format(timeout_s * 1000), why), reports
    state, restarts, _ = job.finish()
    assert (state, restarts) == ("FAILED", 0), job.output()[-3000:]
    resubmit_resumes_exactly(cluster, tmp_path, clean)
