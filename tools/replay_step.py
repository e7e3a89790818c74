"""Replay the micro-batch of a step that went inf/nan and name the module where the first non-finite value was born.

    python tools/replay_step.py RUN_FOLDER/nonfinite-stepN.pt [--cfg CONFIG] [--device cpu|cuda]

The training run wrote the file when it skipped a step (see docs/debugging.md): the micro-batch, the RNG state
before its forward, the weights, the loss scale and the autocast dtype. This tool builds the task's model from
the run's config (``config.yaml`` next to the file, or ``--cfg``), loads those weights and replays forward and
backward with hooks (:func:`common.diagnostics.nonfinite.replay`), then prints the first module whose output (forward)
or input gradient (backward) held inf/nan, and what the training run found. Exit code 0 when the replay finds
the same place as the run, 1 when it finds another or none (a non-deterministic kernel, another rank's batch).
"""
import argparse
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from common import amp  # noqa: E402
from common.checkpoint.checkpointer import load_model_state_dict  # noqa: E402
from common.cli import run_main  # noqa: E402
from common.diagnostics.nonfinite import Finding, batch_fields, replay  # noqa: E402
from common.errors import UserInputError  # noqa: E402
from common.fileio.safe_load import load_tensors  # noqa: E402
from common.modeling.module import held_random_init_warnings  # noqa: E402
from common.task import TASKS, get_task  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser("Replay a non-finite training step and name the module where it began")
    parser.add_argument("file", help="nonfinite-stepN.pt written by the training run")
    parser.add_argument("--cfg", help="the run's config (default: config.yaml next to the file)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where to replay (default: the first GPU when there is one, else the CPU)")
    return parser.parse_args(argv)


def load_step(path):
    """The dict a training run wrote to ``nonfinite-stepN.pt``.

    Raises:
        UserInputError: the file is missing or not such a file.
    """
    try:
        saved = load_tensors(path, what="nonfinite-stepN.pt file")
    except FileNotFoundError:
        raise UserInputError("{}: no such file".format(path)) from None
    keys = {"task", "batch", "rng", "state_dict", "dtype", "loss_scale", "step", "micro_batch"}
    if not isinstance(saved, dict) or not keys <= set(saved):
        raise UserInputError("{}: not a nonfinite-stepN.pt file (expected the keys {})".format(path, sorted(keys)))
    return saved


def task_named(name, source):
    """The task ``name`` (its package imported when needed); UserInputError naming ``source`` otherwise."""
    try:
        return get_task(name)
    except KeyError:
        raise UserInputError("{}: task {!r} is not registered (known: {})".format(source, name, ", ".join(TASKS.names())))


def main(argv=None):
    args = parse_args(argv)
    saved = load_step(args.file)
    task = task_named(saved["task"], args.file)
    cfg_path = args.cfg or os.path.join(os.path.dirname(os.path.abspath(args.file)), "config.yaml")
    if not os.path.exists(cfg_path):
        raise UserInputError("{}: the run's config is not there; give it with --cfg".format(cfg_path))
    cfg = task.load_config(cfg_path)
    device = torch.device(args.device)
    with held_random_init_warnings():  # every weight comes from the file
        model = task.build_model(cfg)
    load_model_state_dict(model, saved["state_dict"], source=args.file)
    model.to(device).train()
    finding = replay(model, batch_fields(saved["batch"]), saved["rng"],
                     amp.autocast_context(device.type, saved["dtype"]), saved["loss_scale"], device,
                     saved["micro_batch"])
    print("step {}, micro-batch {} ({}, loss scale {:g}) on {}".format(
        saved["step"], saved["micro_batch"], saved["dtype"], saved["loss_scale"], device))
    print("replay: " + (finding.describe() if finding else "every value stayed finite"))
    recorded = Finding(**saved["finding"]) if saved.get("finding") else None
    print("training run: " + (recorded.describe() if recorded else "every value stayed finite"))
    same = finding is not None and recorded is not None and \
        (finding.direction, finding.module, finding.parameter) == (recorded.direction, recorded.module,
                                                                    recorded.parameter)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(run_main(main))
