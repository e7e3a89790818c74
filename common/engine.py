"""Task-independent training and evaluation set-up: what every ``<task>/function/train.py`` does.

A task supplies a :class:`Task` (its model registry, metrics and host metric); this module
builds the rest from the config, in the order the design fixes::

    process group -> output folder + logger -> seed -> model (+ partial pretrain) -> loaders
    -> optimizer -> amp.initialize -> scheduler -> resume -> DDP -> callbacks -> train

The reference release repeats this set-up in every task's ``function/train.py``; here it is
written once.
"""
import logging
import os
import random
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch
from tensorboardX import SummaryWriter

from common import amp
from common import distributed as cdist
from common.callbacks.checkpoint import checkpoint_callbacks
from common.callbacks.speedometer import Speedometer
from common.callbacks.validation_monitor import ValidationMonitor
from common.checkpoint import load_checkpoint_file, load_model_state_dict, load_partial_pretrain, resume_training
from common.cli import setup_output
from common.data.build import make_dataloader
from common.lr_scheduler import build_lr_scheduler, updates_per_epoch
from common.optim import build_optimizer
from common.trainer import to_device, train

# Apex's floor for the dynamic loss scale in the reference's amp.initialize call.
MIN_LOSS_SCALE = 128.0


@dataclass
class Task:
    """What a task adds to the shared set-up.

    Attributes:
        build_model: config -> model (``outputs, loss = model(*batch)`` in train mode).
        build_metrics: (config, for_training) -> metric with update(outputs)/get()/reset().
        host_metric_name: validation metric that picks the best epoch (e.g. 'Acc').
        find_unused_parameters: the model may leave trainable params out of a step's graph
            (DDP must then look for them, which costs a graph traversal per synced micro-batch).
        check_config: (config, source) -> None; warns about keys without effect and raises
            ConfigError on refused values (the task config's ``check_config``, see
            :mod:`common.config_keys`). Called first by the entry points.
    """
    build_model: Callable
    build_metrics: Callable
    host_metric_name: str = "Acc"
    find_unused_parameters: bool = False
    check_config: Optional[Callable] = None


def check_inputs(cfg):
    """Raise one FileNotFoundError listing every data folder or pretrained file the config names but
    this machine lacks, with the documents that say how to get them (before anything is written)."""
    datasets = cfg.DATASET if isinstance(cfg.DATASET, list) else [cfg.DATASET]
    net = cfg.NETWORK
    missing = ["DATASET.DATASET_PATH: data folder '{}'".format(d.DATASET_PATH)
               for d in datasets if not os.path.isdir(d.DATASET_PATH)]
    if net.BERT_MODEL_NAME and not os.path.isdir(net.BERT_MODEL_NAME):
        missing.append("NETWORK.BERT_MODEL_NAME: BERT folder '{}'".format(net.BERT_MODEL_NAME))
    image_weights = "{}-{:04d}.model".format(net.IMAGE_PRETRAINED, net.IMAGE_PRETRAINED_EPOCH)
    if net.IMAGE_PRETRAINED and not net.IMAGE_FEAT_PRECOMPUTED and not os.path.isfile(image_weights):
        missing.append("NETWORK.IMAGE_PRETRAINED: ResNet weights '{}'".format(image_weights))
    if net.PARTIAL_PRETRAIN and not os.path.isfile(net.PARTIAL_PRETRAIN):
        missing.append("NETWORK.PARTIAL_PRETRAIN: checkpoint '{}'".format(net.PARTIAL_PRETRAIN))
    if missing:
        raise FileNotFoundError(
            "the config names inputs that are not on this machine:\n  " + "\n  ".join(missing) +
            "\nSee data/PREPARE_DATA.md (data) and model/pretrained_model/PREPARE_PRETRAINED_MODELS.md "
            "(pretrained models), or override the paths with --opts KEY VALUE ('' = random init).")


def seed_everything(seed, rank=0):
    """Seed python, numpy and torch with ``seed + rank``; a negative seed leaves them alone."""
    if seed < 0:
        return
    random.seed(seed + rank)
    np.random.seed(seed + rank)
    torch.manual_seed(seed + rank)


def build_model(task, cfg, device, log=None):
    """The task's model on ``device``, with NETWORK.PARTIAL_PRETRAIN loaded when set."""
    model = task.build_model(cfg)
    if cfg.NETWORK.PARTIAL_PRETRAIN:
        load_partial_pretrain(model, cfg.NETWORK.PARTIAL_PRETRAIN, cfg.NETWORK.PARTIAL_PRETRAIN_PREFIX_CHANGES,
                              segmb_init=cfg.NETWORK.get("PARTIAL_PRETRAIN_SEGMB_INIT", False),
                              load_rel_head=cfg.NETWORK.get("LOAD_REL_HEAD", False), log=log)
    return model.to(device)


def load_for_inference(task, cfg, ckpt_path, device):
    """The task's model with the weights of the checkpoint file ``ckpt_path``, in eval mode.

    Raises:
        common.config.ConfigError: a config value the task refuses (``task.check_config``).
        common.checkpoint.CheckpointError: the file is not a checkpoint or does not fit the model.
    """
    if task.check_config is not None:
        task.check_config(cfg)
    model = task.build_model(cfg)
    load_model_state_dict(model, load_checkpoint_file(ckpt_path)["state_dict"], source=ckpt_path)
    return model.to(device).eval()


@torch.no_grad()
def run_validation(net, val_loader, metrics, label_index_in_batch):
    """Evaluate ``net`` on ``val_loader``: labels are taken out of each batch and put into the outputs.

    The one evaluation rule of the project: the forward runs in fp32 (autocast off), whatever the
    training precision, so epoch-end validation and the val/test scripts give the same predictions
    for the same weights (fp16/bf16 logits of close candidates tie, and argmax then picks the first).

    Args:
        metrics: ``reset()`` first, then ``update(outputs)`` per batch (outputs hold ``label``).
        label_index_in_batch: index of the label in the batch tuple (DATASET.LABEL_INDEX_IN_BATCH).
    """
    if isinstance(net, torch.nn.parallel.DistributedDataParallel):
        net = net.module  # no DDP forward: ranks may hold different numbers of val batches
    was_training = net.training
    net.eval()
    metrics.reset()
    device = next(net.parameters()).device
    with amp.full_precision(net):
        for batch in val_loader:
            batch = to_device(list(batch), device)
            label = batch.pop(label_index_in_batch)
            outputs = net(*batch)
            outputs["label"] = label
            metrics.update(outputs)
    net.train(was_training)


def train_net(args, cfg, task):
    """Train ``task`` as ``cfg`` says; the reference's ``train_net(args, config)`` for any task.

    Args:
        args: parsed :func:`common.cli.train_argument_parser` arguments.
        cfg: frozen config (see :func:`common.cli.config_from_args`).
    Returns:
        (rank, model): the rank of this process and the trained model (unwrapped from DDP).
    """
    if task.check_config is not None:
        task.check_config(cfg, args.cfg)
    check_inputs(cfg)
    dist_ctx = cdist.init_distributed(args.dist, args.slurm)
    rank, world_size, device = dist_ctx.rank, dist_ctx.world_size, dist_ctx.device
    if args.cudnn_off:
        torch.backends.cudnn.enabled = False
    folder, logger = setup_output(cfg, args.cfg, rank)
    logger.info("training on %d process(es), device %s; output folder %s", world_size, device, folder)
    seed_everything(cfg.RNG_SEED, rank)

    model = build_model(task, cfg, device, log=logger.info)
    train_loader = make_dataloader(cfg, "train", world_size, rank)
    val_loader = make_dataloader(cfg, "val", world_size, rank)

    train_cfg = cfg.TRAIN
    optimizer = build_optimizer(cfg, model, world_size)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2" if train_cfg.FP16 else "O0",
                                      loss_scale=train_cfg.FP16_LOSS_SCALE, min_loss_scale=MIN_LOSS_SCALE,
                                      dtype=train_cfg.FP16_DTYPE)
    scaler = amp.scaler_of(optimizer)
    lr_scheduler = build_lr_scheduler(cfg, optimizer, len(train_loader))
    validation_monitor = ValidationMonitor(run_validation, val_loader, task.build_metrics(cfg, False),
                                           host_metric_name=task.host_metric_name,
                                           label_index_in_batch=cfg.DATASET.LABEL_INDEX_IN_BATCH)

    prefix = os.path.join(folder, cfg.MODEL_PREFIX)
    steps_per_epoch = updates_per_epoch(len(train_loader), train_cfg.GRAD_ACCUMULATE_STEPS)
    resumed = resume_training(prefix, train_cfg, model, optimizer, scaler, lr_scheduler, validation_monitor,
                              steps_per_epoch=steps_per_epoch)
    state = None
    if resumed is not None:
        state = resumed.state
        if "lr_scheduler" not in resumed.restored:  # a reference checkpoint: position the schedule
            lr_scheduler = build_lr_scheduler(cfg, optimizer, len(train_loader), begin_step=state.global_step)

    net = model
    if world_size > 1:
        net = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=task.find_unused_parameters)

    writer = None
    if rank == 0:
        writer = SummaryWriter(log_dir=args.log_dir or os.path.join(folder, "tensorboard_logs"))
    epoch_end, batch_end = checkpoint_callbacks(prefix, cfg)
    batch_size = world_size * train_cfg.BATCH_IMAGES
    batch_end.insert(0, Speedometer(batch_size, cfg.LOG_FREQUENT, batches_per_epoch=len(train_loader),
                                    epochs=train_cfg.END_EPOCH - train_cfg.BEGIN_EPOCH))
    try:
        train(net, optimizer, lr_scheduler, train_loader, train_loader.batch_sampler,
              task.build_metrics(cfg, True), train_cfg.BEGIN_EPOCH, train_cfg.END_EPOCH, logger,
              rank=rank, batch_end_callbacks=batch_end, epoch_end_callbacks=epoch_end, writer=writer,
              validation_monitor=validation_monitor, fp16=train_cfg.FP16, clip_grad_norm=train_cfg.CLIP_GRAD_NORM,
              gradient_accumulate_steps=train_cfg.GRAD_ACCUMULATE_STEPS, state=state, scaler=scaler,
              max_consecutive_skips=train_cfg.MAX_CONSECUTIVE_SKIPS, log_frequent=cfg.LOG_FREQUENT,
              val_frequent=cfg.VAL_FREQUENT)
        cdist.barrier()  # all ranks finish before the group is destroyed (a rank leaving early aborts the others)
    finally:
        if writer is not None:
            writer.close()
        cdist.cleanup()
    logging.getLogger("vlbert").info("training done; best %s %.4f at epoch %d", task.host_metric_name,
                                     validation_monitor.best_val, validation_monitor.best_epoch)
    return rank, model
