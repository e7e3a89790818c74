"""Training curves of a run as one PNG, read from its TensorBoard events.

    python tools/plot_curves.py RUN_DIR [--out FILE.png]

RUN_DIR is a run's output folder (the one holding ``tensorboard_logs/``), that ``tensorboard_logs``
folder itself, or any folder above exactly one of them. Panels: losses; train and val accuracy (every
other ``Train-*`` / ``Val-*`` metric); LR of each param group; loss scale and skipped steps; samples/s
and peak memory. The x axis is TensorBoard's: the global micro-batch index. Writes
``RUN_DIR/curves.png`` unless ``--out`` says otherwise and prints the path.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common.cli import run_main  # noqa: E402
from common.diagnostics.tb_events import read_scalars  # noqa: E402
from common.diagnostics.curves import plot  # noqa: E402
from common.errors import UserInputError  # noqa: E402


def events_folder(run_dir):
    """The ``tensorboard_logs`` folder of ``run_dir`` (see the module docstring).

    Raises:
        UserInputError: no such folder, none below it, or several below it.
    """
    if not os.path.isdir(run_dir):
        raise UserInputError("{}: no such folder".format(run_dir))
    if any(".tfevents." in n for n in os.listdir(run_dir)):
        return run_dir
    found = sorted(root for root, _, files in os.walk(run_dir)
                   if os.path.basename(root) == "tensorboard_logs" and any(".tfevents." in n for n in files))
    if not found:
        raise UserInputError("{}: no tensorboard_logs folder with event files in or below it".format(run_dir))
    if len(found) > 1:
        raise UserInputError("{}: several runs below it, name one of: {}".format(run_dir, ", ".join(found)))
    return found[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", help="run output folder (with tensorboard_logs/) or a folder above it")
    parser.add_argument("--out", help="PNG to write (default RUN_DIR/curves.png)")
    args = parser.parse_args()
    scalars = read_scalars(events_folder(args.run_dir))
    out = args.out or os.path.join(args.run_dir, "curves.png")
    plot(scalars, out)
    print(out)


if __name__ == "__main__":
    run_main(main)
