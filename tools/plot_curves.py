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


def panels(scalars):
    """``[(title, [(tag, points), ...], [(tag, points) on a second axis, ...]), ...]`` of the figure."""
    def pick(keep):
        return [(t, scalars[t]) for t in sorted(scalars) if keep(t)]

    metric = lambda t: t.startswith(("Train-", "Val-"))  # noqa: E731
    return [
        ("loss", pick(lambda t: metric(t) and "Loss" in t), []),
        ("accuracy and other metrics", pick(lambda t: metric(t) and "Loss" not in t), []),
        ("learning rate", pick(lambda t: t.startswith("LR/")), []),
        ("loss scale (left), skipped steps (right)", pick(lambda t: t == "Loss-Scale"),
         pick(lambda t: t == "Skipped-Steps")),
        ("samples/s (left), peak memory MiB (right)", pick(lambda t: t.startswith("Speed/")),
         pick(lambda t: t.startswith("Memory/"))),
    ]


def plot(scalars, out):
    """Draw :func:`panels` of ``scalars`` into the PNG file ``out``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = panels(scalars)
    fig, axes = plt.subplots(len(rows), 1, figsize=(8, 2.6 * len(rows)), sharex=True)
    for ax, (title, left, right) in zip(axes, rows):
        ax.set_title(title, fontsize=10)
        for tag, points in left:
            ax.plot(*zip(*points), marker="." if len(points) < 50 else None, label=tag)
        if right:
            twin = ax.twinx()
            for tag, points in right:
                twin.plot(*zip(*points), color="tab:red", label=tag)
            twin.legend(loc="upper right", fontsize=8)
        if left:
            ax.legend(loc="upper left", fontsize=8)
        else:
            ax.text(0.5, 0.5, "not logged", transform=ax.transAxes, ha="center", va="center", color="gray")
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("global micro-batch")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


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
