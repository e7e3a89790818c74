"""A markdown table of finished runs: config, task metric, the paper's figure for that config, GPU-hours.

    python tools/results_table.py RUN_FOLDER [RUN_FOLDER ...]

Each RUN_FOLDER is a training output folder holding ``run.json`` (written by every training run, see
docs/debugging.md). The task metric is the best validation value of the run's host metric (``Acc``, ``SoftAcc``,
``RefAcc``, ...) over its epochs, in percent, with its epoch; the paper's figure comes from
:data:`common.diagnostics.paper_results.PAPER_FIGURES` (the table in docs/fidelity.md), with its split; GPU-hours
(device- hours on the CPU) are the sum over the finished epochs of wall time x processes, resumes included.
"""
import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.cli import run_main  # noqa: E402
from common.diagnostics.paper_results import config_name, paper_figure  # noqa: E402
from common.diagnostics.run_record import FILE, load_record  # noqa: E402
from common.errors import UserInputError  # noqa: E402


def row(folder):
    """The table cells of the run in ``folder``.

    Raises:
        UserInputError: ``folder`` has no readable run.json.
    """
    record = load_record(folder)
    if record is None:
        raise UserInputError("{}: no readable {} (is it a training run folder?)".format(folder, FILE))
    config = record.get("config_file") or ""
    metric = record.get("host_metric") or "?"
    epochs = record.get("epochs", [])
    scored = [(e["metrics"][metric], e["epoch"]) for e in epochs
              if isinstance(e.get("metrics", {}).get(metric), (int, float)) and math.isfinite(e["metrics"][metric])]
    if scored:
        value, epoch = max(scored, key=lambda s: (s[0], -s[1]))  # the earliest epoch of the best value
        result = "{} {:.2f} (epoch {})".format(metric, 100 * value, epoch)
    else:
        result = "{} - (not validated)".format(metric)
    figure = paper_figure(config)
    paper = "{:.2f} ({}, {})".format(figure.value, figure.what, figure.split) if figure else "-"
    hours = sum(e.get("wall_s", 0) * e.get("world_size", record.get("world_size", 1)) for e in epochs) / 3600
    devices = record.get("env", {}).get("devices", {}).get("type", "?")
    return [config_name(config) if config else folder, result, paper, "{:.3f} ({})".format(hours, devices)]


def table(folders):
    """The markdown table (a string, lines joined by newlines) of the runs in ``folders``."""
    lines = ["| config | task metric (best val, %) | paper (%) | GPU-hours |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(row(folder)) + " |" for folder in folders]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folders", nargs="+", metavar="RUN_FOLDER", help="training output folders (with run.json)")
    args = parser.parse_args(argv)
    print(table(args.folders))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
