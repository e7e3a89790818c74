"""Model EMA (timm's ``ModelEmaV3``): an exponential moving average of the weights, validated and saved
as its own weights."""
import copy
import os

import torch
from torch import nn

from common.checkpoint.checkpointer import load_model_state_dict, model_state_fp32, unwrap_model, write_checkpoint_file
from common.runtime import distributed as cdist
from common.runtime.logs import get_logger

from .base import HookBase

logger = get_logger(__name__)


def ema_checkpoint_path(prefix):
    """``{prefix}-ema.model``: the newest EMA weights (a checkpoint with ``state_dict`` only; val/test
    scripts read it as any checkpoint)."""
    return "{}-ema.model".format(prefix)


class ModelEma(HookBase):
    """After every applied optimizer step, ``ema = decay * ema + (1 - decay) * weights`` (floating-point
    buffers too; integer buffers are copied), on the model's device; after each validated epoch, the EMA model is validated like the model
    (``Val-EMA-<metric>`` log line and TensorBoard scalars) and written to :func:`ema_checkpoint_path`.

    ``state_dict()`` (saved in the training checkpoint under ``ema``) is the EMA weights, so a resumed run
    continues the same average.

    Args:
        model: the trained model (DDP-wrapped or not).
        decay: in (0, 1) (TRAIN.EMA_DECAY).
        monitor: the :class:`common.hooks.validation_monitor.ValidationMonitor` whose ``val_func``, loader and
            label position it reuses and whose ``validated`` says when.
        metrics: a fresh validation metrics object (not the monitor's, which later hooks read).
        prefix: ``{output folder}/{MODEL_PREFIX}``.
        shard: None, or a function that shards a model in place (:func:`common.parallel.fsdp.shard_model`):
            the EMA copy is sharded as the model will be (pass the model before it is sharded; a sharded
            model cannot be copied). A model on the meta device gives a copy on the meta device, to fill with
            :func:`common.parallel.meta_init.fill`.
    """

    def __init__(self, model, decay, monitor, metrics, prefix, shard=None):
        if not 0 < decay < 1:
            raise ValueError("TRAIN.EMA_DECAY must be in (0, 1), got {}".format(decay))
        from timm.utils import ModelEmaV3  # imported only by runs that ask for EMA (timm takes seconds to import)

        self.model = unwrap_model(model)
        # A sharded model's state mixes DTensor parameters and plain buffers, which one multi-tensor lerp refuses.
        if next(self.model.parameters()).is_meta:
            # built on the meta device (common.parallel.meta_init), filled once sharded: ModelEmaV3 makes a
            # generator on its copy's device, which the meta device refuses, so it gets its copy after (made on a
            # stand-in whose initial draws leave no trace on the run's generator)
            with torch.random.fork_rng(devices=[]):
                self.ema = ModelEmaV3(nn.Linear(1, 1), decay=decay, foreach=False)
            self.ema.module = copy.deepcopy(self.model).eval()
        else:
            self.ema = ModelEmaV3(self.model, decay=decay, foreach=shard is None)
        if shard is not None:
            shard(self.ema.module)
        self.monitor, self.metrics, self.prefix = monitor, metrics, prefix

    def state_dict(self):
        return self.ema.module.state_dict()

    def load_state_dict(self, state):
        load_model_state_dict(self.ema.module, state, "the checkpoint's EMA weights")

    def after_step(self, ctx):
        if ctx.step_applied:
            self.ema.update(self.model)

    def after_epoch(self, ctx):
        if not self.monitor.validated:
            return
        m = self.monitor
        m.val_func(self.ema.module, m.val_loader, self.metrics, m.label_index_in_batch)
        values = dict(self.metrics.get_name_value())
        weights = model_state_fp32(self.ema.module)  # every rank: gathers the shards of a sharded EMA
        if not cdist.is_main_process():
            return
        logger.info("Epoch[{:d}] \tVal-EMA-".format(ctx.epoch) + "".join(
            "{}={:f},\t".format(n, v) for n, v in values.items()))
        if ctx.writer is not None:
            for name, value in values.items():
                ctx.writer.add_scalar("Val-EMA-" + name, value, (ctx.epoch + 1) * ctx.batches_per_epoch - 1)
        os.makedirs(os.path.dirname(os.path.abspath(self.prefix)), exist_ok=True)
        write_checkpoint_file({"state_dict": weights}, ema_checkpoint_path(self.prefix))
