"""common.step_record.StepRecord: the one record the trainer writes per micro-batch and the hooks read."""
import logging

import torch

from common.checkpoint.train_state import new_train_state
from common.hooks.base import HookBase
from common.hooks.summary import RunSummary
from common.step_record import PHASES, StepRecord
from common.trainer import Trainer
from tests.test_trainer import Toy, _batches


class Snapshots(HookBase):
    """Copies what the record says in each after_batch."""

    def __init__(self):
        self.seen = []

    def after_batch(self, ctx):
        r = ctx.record
        self.seen.append((ctx.step_ended, r.micro_batches, r.tried_steps, r.samples, r.total_samples, list(r.lrs)))


def test_trainer_writes_the_record_once_per_micro_batch_and_step():
    model = Toy()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1. / (step + 1))

    class Schedule(HookBase):
        def after_step(self, ctx):
            ctx.lr_scheduler.step()

    snaps = Snapshots()
    trainer = Trainer(model, opt, _batches(6, 3), hooks=[Schedule(), snaps, RunSummary()], lr_scheduler=sched,
                      grad_accumulate_steps=2, logger=logging.getLogger("test_events"))
    trainer.train(0, 1, new_train_state(global_step=4, skipped_steps=1))
    # tried steps go on from the resumed state (4 applied + 1 skipped); the LR is the one each step used
    assert [s[:5] for s in snaps.seen] == [(False, 1, 5, 3, 3), (True, 2, 6, 3, 6), (False, 3, 6, 3, 9),
                                           (True, 4, 7, 3, 12), (False, 5, 7, 3, 15), (True, 6, 8, 3, 18)]
    assert [s[5] for s in snaps.seen if s[0]] == [[0.5], [0.5 / 2], [0.5 / 3]]
    record = trainer.ctx.record
    assert len(record.timings) == len(PHASES) and record.seconds >= sum(record.total_timings) > 0
    assert record.loss == record.loss and record.memory_mb > 0 and record.skipped_steps == 1


def test_windows_and_throughput():
    record = StepRecord(world_size=2)
    record.write_micro_batch(4, (1., 0., 0., 0., 0., 0.), 2.)
    mark = record.mark()
    record.write_micro_batch(4, (0., 1., 0., 0., 0., 0.), 1.)
    record.write_micro_batch(2, (0., 1., 0., 0., 0., 0.), 1.)
    window = record.since(mark)
    assert (window.micro_batches, window.samples, window.seconds) == (2, 6, 2.)
    assert window.timings == (0., 2., 0., 0., 0., 0.)
    assert record.samples_per_s(mark) == 6.  # 6 samples on each of 2 ranks in 2 s
