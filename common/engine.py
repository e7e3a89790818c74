"""Train / val / test entry points shared by every task; each takes a :class:`common.task.Task`.

The task supplies its dataset, model, metrics and pretrain key renames; this module builds the
rest from the config, in the order the design fixes::

    process group -> output folder + logger -> seed -> model (+ partial pretrain) -> loaders -> stateful hooks
    -> FSDP shards (TRAIN.STRATEGY 'fsdp': the model built on the meta device, filled shard by shard)
    -> optimizer -> autocast context + loss scaler -> scheduler
    -> checkpointer + resume -> DDP (TRAIN.STRATEGY 'ddp') -> hooks -> Trainer

The reference release repeats this set-up in every task's ``function/train.py``; here it is
written once.
"""
import os
import random

import numpy as np
import torch
from tensorboardX import SummaryWriter

from common import amp
from common.checkpoint.checkpointer import Checkpointer, load_checkpoint_file, load_model_state_dict
from common.checkpoint.handoff import read_handoff
from common.checkpoint.partial_pretrain import load_partial_pretrain
from common.checkpoint.run_files import write_run_info
from common.cli import config_from_args, setup_output, train_argument_parser, train_output_folder
from common.compile import compile_forward
from common.config.handoff_folder import is_handoff
from common.data.build import make_dataloader
from common.data.multitask import MultiTaskDataLoader, MultiTaskEvalLoader, dataset_configs
from common.diagnostics.nonfinite import NonFiniteProbe
from common.diagnostics.profiling import DataWaitWarning, StepProfiler
from common.diagnostics.run_record import RunRecord, strategy_name
from common.hooks.checkpoint import PreemptionCheckpoint, checkpoint_hooks
from common.hooks.early_stopping import EarlyStopping
from common.hooks.ema import ModelEma
from common.hooks.lr_scheduler import LRSchedulerHook
from common.hooks.speedometer import Speedometer
from common.hooks.summary import RunSummary
from common.hooks.tensorboard import TensorBoardHook
from common.hooks.validation_monitor import ValidationMonitor
from common.inference.evaluation import MetricEvaluator, inference_on_dataset
from common.lr_scheduler import build_lr_scheduler, resume_lr_scheduler, updates_per_epoch
from common.modeling.module import checkpoint_sets_weights, held_random_init_warnings, warn_random_init
from common.optim import build_optimizer
from common.parallel.fsdp import shard_model
from common.runtime import distributed as cdist
from common.runtime.preemption import PREEMPTED_EXIT_CODE, Preempted, PreemptionGuard
from common.parallel.meta_init import fill, record_build
from common.trackers import CHECKPOINT_KEY as TRACKERS_KEY, build_trackers
from common.trainer import DIVERGED_EXIT_CODE, Trainer, TrainingDivergedError

# Apex's floor for the dynamic loss scale in the reference's amp.initialize call.
MIN_LOSS_SCALE = 128.0


def check_inputs(task, cfg):
    """Raise one FileNotFoundError listing every data folder or pretrained file the config names
    (``task.inputs(cfg)``) but this machine lacks, with the documents that say how to get them (before
    anything is written)."""
    missing = ["{}: {} '{}'".format(i.key, i.what, i.path) for i in task.inputs(cfg) if not i.exists()]
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


def build_model(task, cfg, device=None):
    """The model ``cfg.MODULE`` names in ``task``, with ``task.partial_pretrain(cfg)`` loaded when set
    (prefix changes, then the task's own renames) and ``task.init_after_pretrain`` applied, moved to
    ``device`` when given.

    Warns (:class:`common.modeling.module.RandomInitWarning`) about the parts that keep random weights.

    Raises:
        KeyError: unknown MODULE. common.errors.CheckpointError: a pretrain file that does not fit.
    """
    with held_random_init_warnings() as held:
        model = task.build_model(cfg)
    loaded = []
    pretrain = task.partial_pretrain(cfg)
    if pretrain is not None:
        path, prefix_changes = pretrain
        loaded = load_partial_pretrain(model, path, prefix_changes, renames=task.pretrain_renames(cfg),
                                       check=lambda ckpt, source: task.check_checkpoint(cfg, ckpt, source)).loaded
    task.init_after_pretrain(cfg, model)
    warn_random_init(model, held, loaded)  # only parts the partial pretrain file did not fill
    return model if device is None else model.to(device)


def record_sharded_build(task, cfg):
    """:func:`build_model` recorded on the meta device (:func:`common.parallel.meta_init.record_build`) for a
    sharded start, drawing rank 0's initial weights (as DDP gives every rank rank 0's); ``shard_model`` its
    ``.model``, then :func:`common.parallel.meta_init.fill` it. A collective: every rank calls it."""
    return record_build(lambda: build_model(task, cfg), cdist.broadcast_object(torch.get_rng_state()))


def build_loader(task, cfg, mode, world_size=1, rank=0):
    """DataLoader of ``mode`` over the task's dataset (see :func:`common.data.build.make_dataloader`); with a
    ``DATASET`` list, a :class:`common.data.multitask.MultiTaskDataLoader` (training) or
    :class:`common.data.multitask.MultiTaskEvalLoader` (every set read once, in full) over one loader per entry."""
    if isinstance(cfg.DATASET, list):
        loaders = [build_loader(task, sub, mode, world_size, rank) for sub in dataset_configs(cfg)]
        return MultiTaskDataLoader(loaders) if mode == "train" else MultiTaskEvalLoader(loaders)
    return make_dataloader(cfg, mode, world_size, rank, dataset=task.build_dataset(cfg, mode),
                           batch_multiple=task.train_batch_multiple(cfg))


def build_precision(cfg, device, sharded=False):
    """(autocast, scaler) of TRAIN.FP16 / FP16_DTYPE / FP16_LOSS_SCALE on ``device`` (the reference's
    Apex O2 call: dynamic scale floored at 128), for FSDP-sharded gradients when ``sharded``; see
    :func:`common.amp.build_precision`."""
    train_cfg = cfg.TRAIN
    return amp.build_precision(train_cfg.FP16, train_cfg.FP16_DTYPE, device.type,
                               loss_scale=train_cfg.FP16_LOSS_SCALE, min_loss_scale=MIN_LOSS_SCALE, sharded=sharded)


def load_for_inference(task, cfg, ckpt_path, device):
    """The task's model with the weights of the checkpoint file ``ckpt_path`` (or of a hand-off folder,
    :mod:`common.checkpoint.handoff`), in eval mode; inside a process group of several ranks under ``TRAIN.STRATEGY:
    fsdp``, sharded over the ranks (:func:`common.parallel.fsdp.shard_model`).

    Raises:
        common.config.ConfigError: a config value the task refuses (``task.check_config``).
        common.errors.CheckpointError: the file is not a checkpoint or does not fit the model.
        common.errors.UserInputError: ``task.check_checkpoint`` refuses it (another image encoder).
    """
    task.check_config(cfg)
    with held_random_init_warnings(), checkpoint_sets_weights():  # dropped, not read: the checkpoint sets them
        model = task.build_model(cfg)
    ckpt = read_handoff(ckpt_path) if is_handoff(ckpt_path) else load_checkpoint_file(ckpt_path)
    task.check_checkpoint(cfg, ckpt, ckpt_path)
    load_model_state_dict(model, ckpt["state_dict"], source=ckpt_path)
    model = model.to(device).eval()
    if cdist.get_world_size() > 1 and cfg.TRAIN.STRATEGY == "fsdp":
        shard_model(model)  # sharded forwards (common.inference.evaluation): no rank keeps the whole model
    return model


def run_validation(net, val_loader, metrics, label_index_in_batch):
    """Epoch-end validation: ``metrics`` (reset, then updated with each batch's outputs and ``label``) over
    ``val_loader`` through :func:`common.inference.evaluation.inference_on_dataset` (fp32, no DDP forward).

    Args:
        label_index_in_batch: the label field, its name or its position (DATASET.LABEL_INDEX_IN_BATCH);
            None: the batch has no separate label (the model returns its labels in ``outputs``).
    """
    inference_on_dataset(net, val_loader, MetricEvaluator(metrics), label_index_in_batch)


def train_net(args, cfg, task):
    """Train ``task`` as ``cfg`` says; the reference's ``train_net(args, config)`` for any task.

    Args:
        args: parsed :func:`common.cli.train_argument_parser` arguments.
        cfg: frozen config (see :func:`common.cli.config_from_args`).
        task: the :class:`common.task.Task`.
    Returns:
        (rank, model): the rank of this process and the trained model (unwrapped from DDP; sharded under FSDP).
    Raises:
        SystemExit: code :data:`common.runtime.preemption.PREEMPTED_EXIT_CODE` after SIGTERM / SIGUSR1, once the
            checkpoint of the step where every rank stopped is written (:mod:`common.runtime.preemption`); code
            :data:`common.trainer.DIVERGED_EXIT_CODE` after :class:`common.trainer.TrainingDivergedError`, its
            message logged as one ``error:`` line.
    """
    task.check_config(cfg, args.cfg)
    check_inputs(task, cfg)
    dist_ctx = cdist.init_distributed(args.dist, args.slurm, timeout_s=cfg.DIST_TIMEOUT_S)
    rank, world_size, device = dist_ctx.rank, dist_ctx.world_size, dist_ctx.device
    if args.cudnn_off:
        torch.backends.cudnn.enabled = False
    folder, logger = setup_output(cfg, args.cfg, rank)
    logger.info("training on %d process(es), device %s; output folder %s", world_size, device, folder)
    seed_everything(cfg.RNG_SEED, rank)

    # FSDP shards the model (and the EMA copy) before the optimizer is built over the shards; a run without a
    # process group (one process, no launcher) has nothing to shard over and trains the whole model.
    sharded = cfg.TRAIN.STRATEGY == "fsdp" and torch.distributed.is_initialized()
    with held_random_init_warnings() as random_parts:  # issued unless a checkpoint is resumed below
        if sharded:  # built on the meta device, filled once sharded (rank 0's draws, as DDP gives every rank)
            recording = record_sharded_build(task, cfg)
            model = recording.model
        else:
            model = build_model(task, cfg, device)
    train_loader = build_loader(task, cfg, "train", world_size, rank)
    val_loader = build_loader(task, cfg, "val", world_size, rank)
    if rank == 0:
        write_run_info(folder, task.run_info(cfg, getattr(train_loader, "dataset", None)))

    train_cfg = cfg.TRAIN
    validation = ValidationMonitor(run_validation, val_loader,
                                   task.build_metrics(cfg, False), host_metric_name=task.host_metric(cfg),
                                   label_index_in_batch=task.label_index_in_batch(cfg),
                                   val_frequent=cfg.VAL_FREQUENT)
    prefix = os.path.join(folder, cfg.MODEL_PREFIX)
    steps_per_epoch = updates_per_epoch(len(train_loader), train_cfg.GRAD_ACCUMULATE_STEPS)
    # Stateful hooks, run after the validation (in this order) and saved in the checkpoint under their key.
    stateful = {}
    if train_cfg.EMA_DECAY > 0:
        stateful["ema"] = ModelEma(model, train_cfg.EMA_DECAY, validation, task.build_metrics(cfg, False), prefix,
                                   shard=shard_model if sharded else None)
    if train_cfg.EARLY_STOP_METRIC:
        stateful["early_stopping"] = EarlyStopping(validation, train_cfg.EARLY_STOP_METRIC, train_cfg.EARLY_STOP_MODE,
                                                   train_cfg.EARLY_STOP_PATIENCE)
    if sharded:
        shard_model(model)
        fill(recording, device, others=[stateful["ema"].ema.module] if "ema" in stateful else ())
        del recording
    optimizer = build_optimizer(cfg, model, world_size)
    autocast, scaler = build_precision(cfg, device, sharded)
    lr_scheduler = build_lr_scheduler(cfg, optimizer, len(train_loader))
    run_record = RunRecord(folder, cfg, args.cfg, task.inputs(cfg), validation, world_size, device,
                           strategy_name(world_size, sharded))
    tracker_runs, trackers = build_trackers(cfg, args.cfg, folder, run_record, validation, rank, world_size)
    saved = dict(stateful, **({TRACKERS_KEY: tracker_runs} if trackers else {}))  # a resumed run's tracker runs
    checkpointer = Checkpointer(model, optimizer, prefix, config=cfg, scaler=scaler, lr_scheduler=lr_scheduler,
                                validation_monitor=validation, extra=saved,
                                check=lambda ckpt, path: task.check_checkpoint(cfg, ckpt, path),
                                async_save=train_cfg.ASYNC_CHECKPOINT)
    base_lrs = [group["initial_lr"] for group in optimizer.param_groups]  # the config's; a checkpoint replaces them
    resumed = checkpointer.resume(train_cfg, steps_per_epoch=steps_per_epoch)
    state = None
    if resumed is None:
        warn_random_init(model, random_parts)
    else:
        state = resumed.state
        # The config's schedule at the checkpoint's step; of the saved scheduler only its progress stays.
        lr_scheduler = resume_lr_scheduler(cfg, optimizer, len(train_loader), state["global_step"], base_lrs,
                                           lr_scheduler if "lr_scheduler" in resumed.restored else None,
                                           resumed.config)
        checkpointer.lr_scheduler = lr_scheduler

    net = compile_forward(model, train_cfg.COMPILE)
    if world_size > 1 and not sharded:
        # DDP rebuilds its gradient buckets once, in the order the first backward made the gradients, and a
        # ring all-reduce of 3 or more ranks sums each element in an order set by its place in a bucket: a
        # resumed run's first step would sum otherwise than the uninterrupted run's. find_unused_parameters
        # keeps the first buckets (2 ranks sum alike in either order).
        net = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=task.find_unused_parameters or world_size > 2)

    writer = None
    if rank == 0 and "tensorboard" in cfg.REPORT_TO:
        # TensorBoard's x is the global micro-batch index (see common/hooks/tensorboard.py). A resumed run
        # starts at x = purge_step: TensorBoard hides the points at x >= purge_step that the dead run
        # wrote after its last checkpoint, so each x keeps one point.
        purge_step = None if state is None else state["epoch"] * len(train_loader) + state["epoch_batch"]
        writer = SummaryWriter(log_dir=args.log_dir or os.path.join(folder, "tensorboard_logs"), purge_step=purge_step)
    hooks = [validation, *stateful.values(),
             run_record, LRSchedulerHook(validation), TensorBoardHook(cfg.LOG_FREQUENT), *trackers,
             Speedometer(cfg.LOG_FREQUENT, batches_per_epoch=len(train_loader),
                         epochs=train_cfg.END_EPOCH - train_cfg.BEGIN_EPOCH)]
    hooks.append(DataWaitWarning(cfg.LOG_FREQUENT, cfg.NUM_WORKERS_PER_GPU))
    if train_cfg.PROFILE:
        hooks.append(StepProfiler(folder, *train_cfg.PROFILE, device=device, rank=rank))
    hooks += checkpoint_hooks(checkpointer, cfg, steps_per_epoch)
    hooks.append(RunSummary())
    guard = PreemptionGuard()
    hooks.append(PreemptionCheckpoint(checkpointer, guard))
    trainer = Trainer(net, optimizer, train_loader, scaler=scaler, autocast=autocast, hooks=hooks,
                      metrics=task.build_metrics(cfg, True), lr_scheduler=lr_scheduler, writer=writer,
                      rank=rank, grad_accumulate_steps=train_cfg.GRAD_ACCUMULATE_STEPS,
                      clip_grad_norm=train_cfg.CLIP_GRAD_NORM, max_consecutive_skips=train_cfg.MAX_CONSECUTIVE_SKIPS,
                      logger=logger, probe=NonFiniteProbe(net, autocast, folder, task.name, str(
                          amp.resolve_dtype(train_cfg.FP16_DTYPE) if train_cfg.FP16 else torch.float32
                      ).replace("torch.", ""), write=rank == 0))
    preempted = False
    try:
        try:
            with guard:
                trainer.train(train_cfg.BEGIN_EPOCH, train_cfg.END_EPOCH, state)
        except Preempted:
            preempted = True  # the hook logged where it stopped
        finally:
            checkpointer.wait()  # a background save of the last checkpoint is complete before the process ends
            if writer is not None:
                writer.close()
        # No rank exits before rank 0 has closed its files: a launcher that stops the job on a rank's exit
        # (torchrun, srun --kill-on-bad-exit) would kill it halfway.
        cdist.barrier()
    except TrainingDivergedError as e:
        if rank == 0:
            logger.error("error: %s", e)  # on the console and in the run's log file
        raise SystemExit(DIVERGED_EXIT_CODE) from None
    except RuntimeError as e:
        if not cdist.is_peer_failure(e):
            raise
        # a rank or a node is gone: one line naming it, instead of a traceback per rank
        cdist.report_lost_peers(e, logger)
        raise SystemExit(cdist.PEER_LOST_EXIT_CODE) from None
    finally:
        cdist.cleanup()
    if preempted:
        raise SystemExit(PREEMPTED_EXIT_CODE)
    logger.info("training done; best %s %.4f at epoch %d", task.host_metric(cfg), validation.best_val,
                validation.best_epoch)
    if trainer.ctx.stop_reason:
        logger.info("stopped early: %s", trainer.ctx.stop_reason)
    return rank, model


def inference_device():
    """The device evaluation runs on: the first GPU when there is one, else the CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def test_net(task, cfg, ckpt_path, save_path, save_name):
    """Predict the test split with the checkpoint ``ckpt_path`` and write the task's result file
    under ``save_path`` (name from ``save_name``, see :meth:`common.task.Task.test_evaluator`), through
    :func:`common.inference.evaluation.inference_on_dataset` (fp32). Inside a process group each rank predicts its
    shard of the test set (the task's evaluator gathers them); otherwise one process predicts all.

    Returns:
        path of the written file.
    """
    model = load_for_inference(task, cfg, ckpt_path, inference_device())
    loader = build_loader(task, cfg, "test", cdist.get_world_size(), cdist.get_rank())
    return inference_on_dataset(model, loader, task.test_evaluator(cfg, loader.dataset, save_path, save_name))


def train_main(task, description):
    """Body of ``<task>/train_end2end.py``: arguments -> config -> :func:`train_net`; with ``--do-test``,
    rank 0 then writes the test result file of ``{MODEL_PREFIX}-best.model`` into
    ``<output folder>/test_result``. Wrap it in :func:`common.cli.run_main`."""
    args = train_argument_parser(description).parse_args()
    cfg = config_from_args(args, task)
    rank, _ = train_net(args, cfg, task)
    if args.do_test and rank == 0:
        folder = train_output_folder(cfg, args.cfg)
        ckpt = os.path.join(folder, "{}-best.model".format(cfg.MODEL_PREFIX))
        test_net(task, cfg, ckpt, save_path=os.path.join(folder, "test_result"), save_name=cfg.MODEL_PREFIX)
