"""Turn a sharded checkpoint folder of an FSDP run (TRAIN.STRATEGY 'fsdp', see docs/fsdp.md) into one checkpoint
file of the layout DDP runs write: full tensors, the same keys, read by anything that reads checkpoints.

    python tools/consolidate_checkpoint.py FOLDER OUT.model

The training and evaluation scripts read a folder as it is; this is for handing one file on. Runs on one process
(no process group), holding the whole model and optimizer state in CPU memory. Exit code 2 when FOLDER is not a
readable checkpoint or OUT exists.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.checkpoint.checkpointer import write_checkpoint_file, load_checkpoint_file  # noqa: E402
from common.cli import run_main  # noqa: E402
from common.errors import UserInputError  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="sharded checkpoint folder ({MODEL_PREFIX}-NNNN.model/)")
    parser.add_argument("out", help="checkpoint file to write")
    args = parser.parse_args()
    if os.path.exists(args.out):
        raise UserInputError("{} exists: choose another output path".format(args.out))
    if not os.path.isdir(args.folder):
        raise UserInputError("{} is not a sharded checkpoint folder".format(args.folder))
    write_checkpoint_file(load_checkpoint_file(args.folder), args.out)
    print(args.out)


if __name__ == "__main__":
    run_main(main)
