"""A markdown table of finished runs: config, task metric, the paper's figure for that config, GPU-hours.

    python tools/results_table.py RUN_FOLDER [RUN_FOLDER ...]
    python tools/results_table.py --mlflow URI [--experiment NAME]

Each RUN_FOLDER is a training output folder holding ``run.json`` (written by every training run, see
docs/debugging.md). With ``--mlflow``, the runs of an MLflow store (``sqlite:///RUN/mlflow.db``, a server's
``http://host:port``; ``REPORT_TO`` of docs/tracking.md), each from the ``run.json`` its run holds as an
artifact (written at each epoch end), one row per run, oldest first.

The task metric is the best validation value of the run's host metric (``Acc``, ``SoftAcc``, ``RefAcc``, ...)
over its epochs, in percent, with its epoch; the paper's figure comes from
:data:`common.diagnostics.paper_results.PAPER_FIGURES` (the table in docs/fidelity.md), with its split; GPU-hours (device-
hours on the CPU) are the sum over the finished epochs of wall time x processes, resumes included.
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
    return record_row(record, folder)


def record_row(record, name):
    """The table cells of the run whose ``run.json`` is ``record`` (``name``: the config cell without one)."""
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
    return [config_name(config) if config else name, result, paper, "{:.3f} ({})".format(hours, devices)]


def table(rows):
    """The markdown table (a string, lines joined by newlines) of ``rows`` (:func:`row` cells)."""
    lines = ["| config | task metric (best val, %) | paper (%) | GPU-hours |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines)


def mlflow_rows(uri, experiment=None):
    """The :func:`record_row` cells of each run of the MLflow store ``uri`` (of ``experiment`` only, when given)
    that holds a ``run.json`` artifact, oldest first.

    Raises:
        UserInputError: the store does not answer, or ``experiment`` is not in it.
    """
    import tempfile

    from mlflow.exceptions import MlflowException

    from common.trackers.mlflow_run import client as mlflow_client

    client = mlflow_client(uri)
    try:
        if experiment is None:
            ids = [e.experiment_id for e in client.search_experiments()]
        else:
            found = client.get_experiment_by_name(experiment)
            if found is None:
                raise UserInputError("{}: no experiment {!r}".format(uri, experiment))
            ids = [found.experiment_id]
        runs = client.search_runs(ids, order_by=["attribute.start_time ASC"]) if ids else []
        rows = []
        for run in runs:
            if FILE not in [a.path for a in client.list_artifacts(run.info.run_id)]:
                continue  # stopped before its first epoch end
            with tempfile.TemporaryDirectory() as tmp:
                record = load_record(os.path.dirname(client.download_artifacts(run.info.run_id, FILE, tmp)))
            if record is not None:
                rows.append(record_row(record, run.info.run_name))
    except MlflowException as e:
        raise UserInputError("{}: {}".format(uri, str(e).splitlines()[0])) from None
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folders", nargs="*", metavar="RUN_FOLDER", help="training output folders (with run.json)")
    parser.add_argument("--mlflow", metavar="URI", help="read the runs of this MLflow store instead")
    parser.add_argument("--experiment", help="with --mlflow: this experiment's runs only (a config's name)")
    args = parser.parse_args(argv)
    if bool(args.folders) == bool(args.mlflow):
        raise UserInputError("give run folders or --mlflow URI (one of the two)")
    print(table(mlflow_rows(args.mlflow, args.experiment) if args.mlflow else [row(f) for f in args.folders]))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
