"""Command-line front end shared by the tasks' scripts: arguments, config, output folder, logger.

The flags are the reference release's (``--cfg --model-dir --log-dir --dist --slurm --do-test
--cudnn-off --partial-pretrain``) plus ``--opts KEY VALUE ...`` overrides (detectron2 style).
"""
import argparse
import os
import sys
import time

from common.runtime import rank_errors
from common.config import ConfigError, dump_config
from common.errors import CheckpointError, UserInputError
from common.runtime.distributed import add_launcher_args
from common.runtime.logs import setup_run_logging, start_logging


class _TrainArgumentParser(argparse.ArgumentParser):
    """A parser whose errors are :class:`UserInputError`: under a launcher each rank reports a wrong
    argument, and :func:`run_main` makes it one ``error:`` line (the launcher's, for all ranks)."""

    def error(self, message):
        raise UserInputError("{}: {} (see --help)".format(self.prog, message))


def train_argument_parser(description):
    """The argparse parser of ``<task>/train_end2end.py``; a wrong argument raises :class:`UserInputError`."""
    parser = _TrainArgumentParser(description=description)
    parser.add_argument("--cfg", required=True, help="path to the YAML config file")
    parser.add_argument("--model-dir", help="root folder of the outputs (OUTPUT_PATH is relative to it)")
    parser.add_argument("--log-dir", help="tensorboard folder (default: <output folder>/tensorboard_logs)")
    parser.add_argument("--do-test", action="store_true", help="write the test-set result file after training")
    parser.add_argument("--cudnn-off", action="store_true", help="disable cuDNN")
    parser.add_argument("--partial-pretrain", help="pretraining checkpoint whose matching weights initialise the model "
                        "(NETWORK.PARTIAL_PRETRAIN of a VL-BERT task)")
    parser.add_argument("--opts", nargs=argparse.REMAINDER, default=[],
                        help="config overrides as KEY VALUE pairs, e.g. --opts TRAIN.LR 1e-4")
    add_launcher_args(parser)
    return parser


def eval_argument_parser(description):
    """The argparse parser shared by the one-model ``val.py`` / ``test.py`` scripts: ``--cfg``, ``--ckpt``
    and ``--opts``; a script adds its own options (``--opts`` takes the rest of the line, so it stays last)."""
    parser = argparse.ArgumentParser(description)
    parser.add_argument("--cfg", required=True, help="config file")
    parser.add_argument("--ckpt", required=True, help="checkpoint file")
    parser.add_argument("--opts", nargs=argparse.REMAINDER, default=[], help="config overrides KEY VALUE ...")
    return parser


def config_from_args(args, task):
    """Frozen config of ``task`` (:class:`common.task.Task`) from ``--cfg``, ``--opts``, ``--partial-pretrain``
    and ``--model-dir``.

    ``--partial-pretrain F`` sets the task's ``partial_pretrain_key`` to F; ``--model-dir D`` makes
    OUTPUT_PATH ``D/<OUTPUT_PATH>`` as in the reference.
    Raises:
        ConfigError: ``--partial-pretrain`` for a task that declares no such key; see also
            :meth:`common.task.Task.load_config`.
    """
    opts = list(args.opts)
    if args.partial_pretrain is not None:
        if task.partial_pretrain_key is None:
            raise ConfigError("--partial-pretrain: task '{}' loads no pretraining checkpoint (it declares no "
                              "partial-pretrain key); drop the option".format(task.name))
        opts += [task.partial_pretrain_key, args.partial_pretrain]
    cfg = task.load_config(args.cfg, opts)
    if args.model_dir is not None:
        cfg.defrost()
        cfg.OUTPUT_PATH = os.path.join(args.model_dir, cfg.OUTPUT_PATH)
        cfg.freeze()
    return cfg


def run_main(main):
    """Run ``main()`` with the process's logging started (:func:`common.runtime.logs.start_logging`); a user
    mistake (bad config, missing data, model or checkpoint file) ends the process with its message
    (one ``error:`` line per mistake when it lists several) and exit code 2 instead of a traceback. Under a
    launcher of ``scripts/`` the lines go to the launcher, which prints them once for all ranks
    (:mod:`common.runtime.rank_errors`)."""
    start_logging()
    try:
        return main()
    except (UserInputError, FileNotFoundError, CheckpointError) as e:
        lines = ["error: {}".format(line) for line in getattr(e, "lines", None) or [str(e)]]
        if not rank_errors.record(lines):
            for line in lines:
                print(line, file=sys.stderr)
        sys.exit(rank_errors.USER_ERROR_EXIT_CODE)


def output_folder(cfg, cfg_path, image_set):
    """``<OUTPUT_PATH>/<config file name>/<image_set>`` (the reference's layout)."""
    cfg_name = os.path.splitext(os.path.basename(cfg_path))[0]
    return os.path.join(cfg.OUTPUT_PATH, cfg_name, image_set)


def train_output_folder(cfg, cfg_path):
    """``<OUTPUT_PATH>/<cfg name>/<TRAIN_IMAGE_SET>_train``: logs, config and checkpoints of a run."""
    image_set = cfg.DATASET[0].TRAIN_IMAGE_SET if isinstance(cfg.DATASET, list) else cfg.DATASET.TRAIN_IMAGE_SET
    return output_folder(cfg, cfg_path, "{}_train".format(image_set.replace("+", "_")))


def setup_output(cfg, cfg_path, rank=0):
    """Create the training output folder, the run's logging, and write the effective config there.

    Only rank 0 writes files: the log ``<cfg name>_<date>.log`` (every line the run logs or warns,
    see :mod:`common.runtime.logs`) and ``config.yaml``; other ranks log warnings and errors to stdout.

    Returns:
        (str, logging.Logger): the output folder
        ``<OUTPUT_PATH>/<cfg name>/<TRAIN_IMAGE_SET>_train`` and the ``vlbert`` logger.
    """
    folder = train_output_folder(cfg, cfg_path)
    log_file = None
    if rank == 0:
        os.makedirs(folder, exist_ok=True)
        cfg_name = os.path.splitext(os.path.basename(cfg_path))[0]
        log_file = os.path.join(folder, "{}_{}.log".format(cfg_name, time.strftime("%Y-%m-%d-%H-%M")))
        dump_config(cfg, os.path.join(folder, "config.yaml"))
    return folder, setup_run_logging(log_file, rank)
