"""Test-only training script: the shared trainer, samplers, checkpoints and distributed set-up
on a tiny MLP and a synthetic data set, fast on CPU.

    python tests/tiny_train.py --cfg CFG --model-dir DIR [--dist]

Randomness comes from every source a real run has (dropout, augmentation noise drawn in
``__getitem__``, seeded shuffling), so an inexact resume changes the final parameters. Rank 0
writes the final parameters to ``<output folder>/final.pt``.

Fault injection for the tests, through environment variables:
    TINY_KILL_AFTER_STEP=n   SIGKILL this process right after optimizer step n (after its checkpoint)
    TINY_KILL_IN_SAVE=n      SIGKILL this process while the n-th checkpoint of this run is being written
    TINY_FAIL_RANK=r         raise on rank r at the first optimizer step
"""
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed.elastic.multiprocessing.errors import record  # noqa: E402

from common import amp  # noqa: E402
from common import checkpoint as ck  # noqa: E402
from common.hooks.base import HookBase  # noqa: E402
from common.hooks.checkpoint import checkpoint_hooks  # noqa: E402
from common.hooks.lr_scheduler import LRSchedulerHook  # noqa: E402
from common.cli import config_from_args, setup_output, train_argument_parser  # noqa: E402
from common.data.samplers import make_batch_sampler  # noqa: E402
from common import distributed as cdist  # noqa: E402
from common.trainer import Trainer  # noqa: E402
from vcr.function.config import load_config  # noqa: E402


SCRIPT = os.path.abspath(__file__)
CONFIG = """\
OUTPUT_PATH: ./output
MODEL_PREFIX: tiny
RNG_SEED: 7
DATASET:
  TRAIN_IMAGE_SET: train
TRAIN:
  BATCH_IMAGES: 4
  BEGIN_EPOCH: 0
  END_EPOCH: 3
  LR: 0.1
  MOMENTUM: 0.9
  GRAD_ACCUMULATE_STEPS: 2
  CHECKPOINT_STEPS: 2
  CHECKPOINT_KEEP: 2
  AUTO_RESUME: true
"""


def write_config(folder):
    """Write the tiny run's YAML (40 samples, batches of 4, k=2, 3 epochs, checkpoint every
    2 steps) as ``folder/tiny.yaml``; the run's output folder is ``<model dir>/output/tiny/train_train``.
    Returns the YAML path."""
    path = os.path.join(str(folder), "tiny.yaml")
    with open(path, "w") as f:
        f.write(CONFIG)
    return path


class Data(torch.utils.data.Dataset):
    def __init__(self, n=40):
        g = torch.Generator().manual_seed(123)
        self.x = torch.randn(n, 6, generator=g)
        self.y = (self.x.sum(1) > 0).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i] + 0.1 * torch.randn(6), self.y[i]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 2))

    def forward(self, x, y):
        logits = self.mlp(x)
        return {"logits": logits}, nn.functional.cross_entropy(logits, y)


class FaultInjection(HookBase):
    """SIGKILL after optimizer step TINY_KILL_AFTER_STEP; raise on rank TINY_FAIL_RANK."""

    def __init__(self, rank):
        self.rank = rank
        self.kill_after = int(os.environ.get("TINY_KILL_AFTER_STEP", -1))
        self.fail_rank = int(os.environ.get("TINY_FAIL_RANK", -1))

    def after_batch(self, ctx):
        if ctx.step_ended and ctx.state["global_step"] == self.kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.rank == self.fail_rank:
            raise RuntimeError("injected failure on rank {}".format(self.rank))


def kill_in_save(n):
    """Make the n-th ``torch.save`` of the checkpoint module write half a file, then SIGKILL."""
    real_save, calls = torch.save, [0]

    def save(obj, f):
        calls[0] += 1
        if calls[0] == n:
            f.write(b"\x80\x02partial checkpoint")
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        real_save(obj, f)
    torch.save = save  # global, but only in this child process


@record
def main():
    args = train_argument_parser("tiny training run").parse_args()
    cfg = config_from_args(args, load_config)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist_ctx = cdist.init_distributed(args.dist, args.slurm, timeout_s=60)
    rank, world = dist_ctx.rank, dist_ctx.world_size
    folder, logger = setup_output(cfg, args.cfg, rank)
    prefix = os.path.join(folder, cfg.MODEL_PREFIX)
    if "TINY_KILL_IN_SAVE" in os.environ:
        kill_in_save(int(os.environ["TINY_KILL_IN_SAVE"]))

    torch.manual_seed(cfg.RNG_SEED)
    net = Net()
    data = Data()
    batch_sampler = make_batch_sampler(data, cfg.TRAIN.BATCH_IMAGES, True, world, rank,
                                       seed=max(cfg.RNG_SEED, 0))
    # Own generator: creating an iterator must not draw from the global RNG (exact resume).
    loader = torch.utils.data.DataLoader(data, batch_sampler=batch_sampler, generator=torch.Generator())
    k = cfg.TRAIN.GRAD_ACCUMULATE_STEPS
    optimizer = torch.optim.SGD(net.parameters(), lr=cfg.TRAIN.LR, momentum=cfg.TRAIN.MOMENTUM)
    steps_per_epoch = -(-len(loader) // k)
    lr_scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, [steps_per_epoch, 2 * steps_per_epoch], 0.5)
    scaler = amp.LossScaler("dynamic", min_loss_scale=128., growth_interval=3)
    model = nn.parallel.DistributedDataParallel(net) if dist_ctx.distributed else net

    resumed = ck.resume_training(prefix, cfg.TRAIN, model, optimizer, scaler, lr_scheduler,
                                 steps_per_epoch=steps_per_epoch)
    if resumed is not None:
        logger.info("RESUMED %s epoch %d batch %d", os.path.basename(resumed.path), resumed.state["epoch"],
                    resumed.state["epoch_batch"])
    hooks = [LRSchedulerHook()] + checkpoint_hooks(prefix, cfg) + [FaultInjection(rank)]
    trainer = Trainer(model, optimizer, loader, scaler=scaler, hooks=hooks, lr_scheduler=lr_scheduler,
                      rank=rank if world > 1 else None, grad_accumulate_steps=k,
                      clip_grad_norm=cfg.TRAIN.CLIP_GRAD_NORM, logger=logger)
    state = trainer.train(cfg.TRAIN.BEGIN_EPOCH, cfg.TRAIN.END_EPOCH, resumed.state if resumed else None)
    if rank == 0:
        torch.save({"params": ck.model_state_fp32(model), "global_step": state["global_step"],
                    "world_size": world}, os.path.join(folder, "final.pt"))
        logger.info("DONE global_step %d", state["global_step"])
    # Leave together: a rank exiting while the others still hold the gloo group can abort them.
    cdist.barrier()
    cdist.cleanup()


if __name__ == "__main__":
    main()
