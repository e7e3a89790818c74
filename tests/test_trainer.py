"""common.trainer: accumulation, skipping, divergence guard, mixed precision, resume, logging, hooks."""
import copy
import logging
import os
import socket
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from common import amp
from common.checkpoint.train_state import check_train_state, new_train_state
from common.hooks.base import HookBase
from common.hooks.lr_scheduler import LRSchedulerHook
from common.hooks.speedometer import Speedometer
from common.hooks.tensorboard import TensorBoardHook
from common.hooks.validation_monitor import ValidationMonitor
from common.metrics.composite_eval_metric import CompositeEvalMetric
from common.metrics.eval_metric import EvalMetric
from common.runtime.logs import setup_run_logging, start_logging
from common.trainer import Trainer, TrainingDivergedError

LOGGER = logging.getLogger("test_trainer")


class Toy(torch.nn.Module):
    """Linear regression head; batch = (x [B, 4], y [B, 1], bad [B]) where bad=inf poisons the loss."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 1)
        self.seen = []  # (epoch tag, batch id) per forward, when the batch carries them

    def forward(self, x, y, bad=None, ids=None):
        pred = self.fc2(torch.relu(self.fc1(x))).float()
        loss = torch.nn.functional.mse_loss(pred, y)
        if bad is not None:
            loss = loss + (bad[0] * self.fc1.weight.sum())
        if ids is not None:
            self.seen.append(ids.tolist())
        return {"pred": pred, "label": y}, loss


class MSE(EvalMetric):
    def __init__(self):
        super().__init__("MSE")

    def update(self, outputs):
        self.sum_metric = self.sum_metric + ((outputs["pred"] - outputs["label"]) ** 2).sum().double()
        self.num_inst = self.num_inst + outputs["pred"].shape[0]


def _batches(n, b, seed=1, scale=1.):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(b, 4, generator=g), scale * torch.randn(b, 1, generator=g), torch.zeros(b))
            for _ in range(n)]


class GradRecorder:
    """Optimizer step pre-hook: the gradients seen by every applied step."""

    def __init__(self, optimizer):
        self.grads = []
        optimizer.register_step_pre_hook(self)

    def __call__(self, optimizer, args, kwargs):
        self.grads.append([p.grad.clone() for g in optimizer.param_groups for p in g["params"]])


class OnBatch(HookBase):
    """Calls ``fn(ctx)`` after every micro-batch."""

    def __init__(self, fn):
        self.fn = fn

    def after_batch(self, ctx):
        self.fn(ctx)


class OnEpoch(HookBase):
    """Calls ``fn(ctx)`` after every epoch."""

    def __init__(self, fn):
        self.fn = fn

    def after_epoch(self, ctx):
        self.fn(ctx)


def _precision(dtype="float16", loss_scale="dynamic"):
    """The engine's explicit mixed precision on the CPU: (autocast, scaler)."""
    return amp.build_precision(True, dtype, "cpu", loss_scale=loss_scale, min_loss_scale=128.)


def _run(model, optimizer, loader, k=1, epochs=1, lr_scheduler=None, validation_monitor=None, hooks=(),
         state=None, precision=None, **kwargs):
    """Train as the engine does: the validation, LR and TensorBoard hooks first, then ``hooks``."""
    autocast, scaler = precision or (amp.autocast_context("cpu", "float32"), None)
    all_hooks = ([validation_monitor] if validation_monitor else []) + [LRSchedulerHook(validation_monitor),
                                                                         TensorBoardHook()] + list(hooks)
    trainer = Trainer(model, optimizer, loader, scaler=scaler, autocast=autocast, hooks=all_hooks,
                      lr_scheduler=lr_scheduler, grad_accumulate_steps=k, logger=LOGGER, **kwargs)
    return trainer.train(0, epochs, state)


def _full_grads(model, batches):
    """Gradients of the mean loss over the concatenation of ``batches`` (one big batch)."""
    model = copy.deepcopy(model)
    x, y, bad = (torch.cat(t) for t in zip(*batches))
    model.zero_grad()
    model(x, y, bad)[1].backward()
    return [p.grad.clone() for p in model.parameters()]


def test_k_micro_batches_equal_one_big_batch():
    model = Toy()
    batches = _batches(4, 3)
    expected = _full_grads(model, batches)
    opt = torch.optim.SGD(model.parameters(), lr=0.)
    rec = GradRecorder(opt)
    _run(model, opt, batches, k=4)
    assert len(rec.grads) == 1
    for g, e in zip(rec.grads[0], expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-7)


def test_seven_batches_k4_two_steps_last_normalised_by_three():
    model = Toy()
    batches = _batches(7, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.)  # params fixed: grads comparable to one model
    rec = GradRecorder(opt)
    state = _run(model, opt, batches, k=4)
    assert len(rec.grads) == 2 and state["global_step"] == 2
    for got, group in zip(rec.grads, (batches[:4], batches[4:])):
        for g, e in zip(got, _full_grads(model, group)):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-7)


class EpochTagSampler:
    """Records set_epoch (the trainer calls it on the loader's batch sampler); the loader tags each batch."""
    epoch = None

    def set_epoch(self, epoch):
        self.epoch = epoch


class TaggedLoader:
    def __init__(self, n, sampler):
        self.n, self.sampler, self.base = n, sampler, _batches(n, 1)
        self.batch_sampler = sampler

    def __len__(self):
        return self.n

    def __iter__(self):
        for i, (x, y, bad) in enumerate(self.base):
            yield x, y, bad, torch.tensor([self.sampler.epoch, i])


def test_groups_never_span_epochs():
    model = Toy()
    opt = torch.optim.SGD(model.parameters(), lr=0.)
    groups = []

    def close_group(*_):
        groups.append(list(model.seen))
        model.seen.clear()

    opt.register_step_pre_hook(close_group)
    sampler = EpochTagSampler()
    state = _run(model, opt, TaggedLoader(63, sampler), k=8, epochs=2)
    assert [len(g) for g in groups] == ([8] * 7 + [7]) * 2
    for g in groups:
        assert len({epoch for epoch, _ in g}) == 1
    assert groups[7][-1] == [0, 62] and groups[8][0] == [1, 0]
    assert (state["epoch"], state["epoch_batch"], state["global_step"]) == (2, 0, 16)


def _poison(batches, indices):
    for i in indices:
        batches[i][2].fill_(float("inf"))
    return batches


@pytest.mark.parametrize("loss_scale", ["dynamic", 512.])
def test_inf_gradient_skips_step_and_keeps_everything(loss_scale):
    model = Toy()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1. / (s + 1))
    autocast, scaler = precision = _precision(loss_scale=loss_scale)
    snaps = []

    def snapshot(ctx):
        snaps.append((copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()),
                      sched.last_epoch, scaler.scale))

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        state = _run(model, opt, _poison(_batches(3, 4), [1]), lr_scheduler=sched, precision=precision,
                     hooks=[OnBatch(snapshot)])
    (m0, o0, s0, scale0), (m1, o1, s1, scale1), (_, o2, s2, _) = snaps
    for k in m0:
        assert torch.equal(m0[k], m1[k])
    for i in o0["state"]:
        for k in o0["state"][i]:
            assert torch.equal(o0["state"][i][k], o1["state"][i][k])
    assert s0 == s1 == 1 and s2 == 2
    assert o2["state"][0]["step"].item() == 2
    assert scale1 == (scale0 / 2 if loss_scale == "dynamic" else scale0)
    assert (state["global_step"], state["skipped_steps"], state["consecutive_skips"]) == (2, 1, 0)


def test_divergence_guard_fires_after_n_consecutive_skips():
    model = Toy()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = _poison(_batches(10, 2), range(2, 10))
    attempts = []
    with pytest.raises(TrainingDivergedError) as err:
        _run(model, opt, batches, precision=_precision(), max_consecutive_skips=5,
             hooks=[OnBatch(lambda ctx: attempts.append(ctx.micro_batch))])
    msg = str(err.value)
    assert attempts == [0, 1, 2, 3, 4, 5]  # raised in the step of batch 6 (5th skip in a row)
    # Batch 0 overflows fp16 at the initial 2**16 scale (halved), batch 1 is applied, batches 2-6
    # are skipped: 2**15 / 2**5.
    assert "5 optimizer steps in a row were skipped" in msg and "(epoch 0, batch 6; step 7, 1 applied)" in msg
    assert "loss scale {:g}".format(2. ** 10) in msg
    x, y, _ = batches[1]
    ref = Toy()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = ref(x, y)[1].item()
    assert "the last finite loss was {:.6g}, at optimizer step 2".format(loss) in msg


class FakeWriter:
    def __init__(self):
        self.scalars = {}

    def add_scalar(self, tag, value, step):
        self.scalars.setdefault(tag, []).append((step, float(value)))


def test_fp16_dynamic_with_clipping_tracks_fp32():
    batches = _batches(30, 8, scale=30.)  # large targets: the norm is far above max_norm
    # fp16 first: the dynamic scale starts at 2**16 and overflows a few times before it settles.
    model16 = Toy()
    opt16 = torch.optim.SGD(model16.parameters(), lr=0.05)
    writer16, applied = FakeWriter(), []
    steps = [0]

    def record_applied(ctx):
        if ctx.state["global_step"] > steps[0]:
            applied.append(ctx.micro_batch)
        steps[0] = ctx.state["global_step"]

    state = _run(model16, opt16, batches, precision=_precision(), clip_grad_norm=1., writer=writer16,
                 hooks=[OnBatch(record_applied)])
    assert state["skipped_steps"] > 0 and state["global_step"] >= 20
    applied = applied[:20]
    # fp32 on the same 20 batches the fp16 run applied (skipped steps leave the params alone).
    model16_at_20 = Toy()
    opt = torch.optim.SGD(model16_at_20.parameters(), lr=0.05)
    _run(model16_at_20, opt, batches[:applied[-1] + 1], precision=_precision(), clip_grad_norm=1.)
    model32, writer32 = Toy(), FakeWriter()
    _run(model32, torch.optim.SGD(model32.parameters(), lr=0.05), [batches[i] for i in applied],
         clip_grad_norm=1., writer=writer32)
    diff = max((a - b).abs().max().item() for a, b in zip(model32.parameters(), model16_at_20.parameters()))
    assert diff < 1e-2
    norms32 = [v for _, v in writer32.scalars["grad-para/Total-Norm"]]
    norms16 = dict(writer16.scalars["grad-para/Total-Norm"])
    assert min(norms32) > 1.
    for i, a in zip(applied, norms32):
        assert norms16[i] == pytest.approx(a, rel=1e-2)


def test_bf16_trains_without_scaling():
    model = Toy()
    autocast, scaler = precision = _precision("bfloat16")
    state = _run(model, torch.optim.SGD(model.parameters(), lr=0.05), _batches(4, 4), precision=precision)
    assert scaler.scale == 1. and state["global_step"] == 4


class SkippableBatchSampler:
    """Minimal stand-in for common.data.samplers.ResumableBatchSampler: one-shot skip(n)."""

    def __init__(self, n):
        self.n, self._skip, self.skipped = n, 0, []

    def skip(self, n):
        self._skip = n
        self.skipped.append(n)

    def __iter__(self):
        start, self._skip = self._skip, 0
        return iter([[i] for i in range(start, self.n)])

    def __len__(self):
        return self.n


@pytest.mark.parametrize("use_skip", [True, False])
def test_resume_mid_epoch_matches_uninterrupted_run(use_skip):
    data = _batches(12, 1)
    dataset = [tuple(t[0] for t in b) for b in data]

    def loader():
        if use_skip:
            return torch.utils.data.DataLoader(dataset, batch_sampler=SkippableBatchSampler(12))
        return torch.utils.data.DataLoader(dataset, batch_size=1)

    def fresh():
        model = Toy()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.9 ** s)

    model, opt, sched = fresh()
    full = _run(model, opt, loader(), k=2, epochs=2, lr_scheduler=sched)

    saved = {}

    def save_at_8(ctx):
        if ctx.epoch == 1 and ctx.micro_batch == 7 and ctx.step_ended:
            saved.update(model=copy.deepcopy(ctx.net.state_dict()), opt=copy.deepcopy(ctx.optimizer.state_dict()),
                         sched=ctx.lr_scheduler.state_dict(), state=dict(ctx.state),
                         scaler=ctx.scaler.state_dict())
            raise KeyboardInterrupt

    m1, o1, s1 = fresh()
    with pytest.raises(KeyboardInterrupt):
        _run(m1, o1, loader(), k=2, epochs=2, lr_scheduler=s1, hooks=[OnBatch(save_at_8)])
    assert saved["state"]["epoch"] == 1 and saved["state"]["epoch_batch"] == 8

    m2, o2, s2 = fresh()
    m2.load_state_dict(saved["model"])
    o2.load_state_dict(saved["opt"])
    s2.load_state_dict(saved["sched"])
    state = check_train_state(saved["state"])
    resumed_loader = loader()
    seen = []
    resumed = _run(m2, o2, resumed_loader, k=2, epochs=2, lr_scheduler=s2, state=state,
                   hooks=[OnBatch(lambda ctx: seen.append((ctx.epoch, ctx.micro_batch)))])
    assert seen == [(1, i) for i in range(8, 12)]
    if use_skip:
        assert resumed_loader.batch_sampler.skipped == [8]
    assert resumed == full
    for a, b in zip(model.parameters(), m2.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_train_state_round_trip_and_missing_key():
    state = new_train_state(epoch=3, epoch_batch=16, global_step=100, skipped_steps=2, consecutive_skips=1,
                            last_finite_loss=0.25)
    other = check_train_state(dict(state))
    assert other == state
    broken = dict(state)
    del broken["global_step"]
    with pytest.raises(KeyError, match="global_step"):
        check_train_state(broken)


def test_logging_speedometer_and_epoch_callbacks(tmp_path):
    log_file = str(tmp_path / "run.log")
    start_logging()  # as a script does first: the log file starts with this run's records only
    setup_run_logging(log_file)
    model = Toy()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    metrics = CompositeEvalMetric([MSE()])
    writer = FakeWriter()
    epoch_calls = []

    def epoch_cb(ctx):
        epoch_calls.append((ctx.epoch, ctx.state["epoch"], ctx.state["epoch_batch"], ctx.scaler.scale))

    _run(model, opt, _batches(6, 2), k=2, metrics=metrics, writer=writer,
         hooks=[Speedometer(frequent=2, batches_per_epoch=6, epochs=1), OnEpoch(epoch_cb)])
    out = [line.split(" ", 2)[2] for line in open(log_file).read().splitlines()]  # (after the time stamp)
    assert out[0].startswith("Epoch[0] Batch [0]\tSpeed: - samples/sec ETA: - d - h - m\tTrain-MSE=")
    assert out[1].startswith("Epoch[0] Batch [2]\tSpeed: ") and " samples/s ETA: 0 d  0 h  0 m\tData: " in out[1]
    assert len(out) == 3 and out[1].endswith(",\t")
    assert epoch_calls == [(0, 1, 0, 1.)]
    assert [s for s, _ in writer.scalars["Train-Loss"]] == [1, 3, 5]
    for tag in ("Train-MSE", "LR/Group_0", "Loss-Scale", "Skipped-Steps", "Speed/samples_per_s", "Memory/peak_MiB"):
        assert len(writer.scalars[tag]) == 3, tag
    assert writer.scalars["Memory/peak_MiB"][0][1] > 10.
    assert "grad-para/Total-Norm" not in writer.scalars
    # the logged metric is the running MSE over the batches seen so far
    preds_mse = writer.scalars["Train-MSE"][-1][1]
    assert preds_mse == pytest.approx(metrics.get()[1][0])

    other_rank = FakeWriter()
    _run(Toy(), torch.optim.SGD(Toy().parameters(), lr=0.01), _batches(2, 2), writer=other_rank, rank=1)
    assert other_rank.scalars == {}


def test_plateau_steps_on_validation_metric_each_epoch():
    model = Toy()
    opt = torch.optim.SGD(model.parameters(), lr=1.)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", factor=0.1, patience=0, cooldown=0)
    scores = iter([0.5, 0.4, 0.3])

    class Const(EvalMetric):
        def update(self, outputs):
            pass

    def val_func(net, loader, metrics, label_index):
        metrics.reset()
        metrics.metrics[0].sum_metric, metrics.metrics[0].num_inst = next(scores), 1.

    monitor = ValidationMonitor(val_func, None, CompositeEvalMetric([Const("Acc")]))
    lrs = []
    _run(model, opt, _batches(2, 2), epochs=3, lr_scheduler=sched, validation_monitor=monitor,
         hooks=[OnEpoch(lambda ctx: lrs.append(ctx.optimizer.param_groups[0]["lr"]))])
    assert lrs == pytest.approx([1., 0.1, 0.01])
    assert monitor.state_dict() == {"best_epoch": 0, "best_val": 0.5}


def test_bad_arguments():
    model = Toy()
    opt = torch.optim.SGD(model.parameters(), lr=1.)
    with pytest.raises(ValueError, match="GRAD_ACCUMULATE_STEPS"):
        _run(model, opt, _batches(2, 2), k=0)
    with pytest.raises(ValueError, match="validation monitor"):
        _run(model, opt, _batches(2, 2), lr_scheduler=torch.optim.lr_scheduler.ReduceLROnPlateau(opt))


# -- 2 DDP ranks on gloo ------------------------------------------------------------------------
def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank, port, batches, k, out):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        model = torch.nn.parallel.DistributedDataParallel(Toy())
        calls = []

        def counting_hook(state, bucket):
            calls.append(1)
            fut = dist.all_reduce(bucket.buffer().div_(2), async_op=True).get_future()
            return fut.then(lambda f: f.value()[0])

        model.register_comm_hook(None, counting_hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.)
        rec = GradRecorder(opt)
        mine = batches[rank * k:(rank + 1) * k]
        metric = MSE()
        _run(model, opt, mine, k=k, metrics=metric)
        torch.save({"grads": rec.grads[0], "calls": len(calls), "mse": metric.get()[1]}, out.format(rank))
        dist.barrier()  # leave together: destroying the gloo group while the peer still uses it aborts the peer
    finally:
        dist.destroy_process_group()


def test_ddp_two_ranks_accumulation_equals_one_big_batch(tmp_path):
    k, b = 3, 2
    batches = _batches(2 * k, b)
    expected = _full_grads(Toy(), batches)
    out = str(tmp_path / "rank{}.pt")
    mp.spawn(_ddp_worker, args=(_free_port(), batches, k, out), nprocs=2, join=True)
    results = [torch.load(out.format(r), weights_only=True) for r in range(2)]
    model = Toy()
    x, y, _ = (torch.cat(t) for t in zip(*batches))
    global_mse = torch.nn.functional.mse_loss(model(x, y)[0]["pred"], y).item()
    for res in results:
        assert res["calls"] == 1  # gradients all-reduced once per group: no_sync on the others
        for g, e in zip(res["grads"], expected):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-7)
        assert res["mse"] == pytest.approx(global_mse, rel=1e-5)
