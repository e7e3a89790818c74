"""Experiment trackers beside TensorBoard: MLflow and Weights & Biases (the config key ``REPORT_TO``).

Each tracker is a hook (:class:`common.trackers.base.TrackerHook`) that reports what TensorBoard shows, at
TensorBoard's steps (:class:`common.hooks.tensorboard.TrainingScalars`), the validation metrics of each epoch,
the effective config and ``run.json``'s tags; only rank 0 talks to a tracker, and a tracker that fails is
warned about once and left off while training goes on. The tracker's run id is kept by :class:`TrackerRuns`
(the checkpoint key ``trackers``) and in ``run.json``, so a resumed run continues the same tracker run.
A tracker's package (mlflow, wandb) is imported only when ``REPORT_TO`` names it. docs/tracking.md.
"""
import importlib.util

from common.errors import UserInputError
from common.trackers.base import TrackerRuns

CHECKPOINT_KEY = "trackers"  # the checkpoint's key of the tracker run ids


def build_trackers(cfg, cfg_path, folder, run_record, validation, rank, world_size):
    """The hooks of the trackers ``cfg.REPORT_TO`` names besides 'tensorboard' (the engine writes that one),
    and the :class:`TrackerRuns` they share (give it to the checkpointer under :data:`CHECKPOINT_KEY`).

    Args:
        cfg: the frozen config; cfg_path: the --cfg file (its name is the experiment's / project's).
        folder: the run folder; run_record: the :class:`common.diagnostics.run_record.RunRecord` hook (tags, run.json).
        validation: the :class:`common.hooks.validation_monitor.ValidationMonitor` (epoch metrics).
        rank: this process's rank (None: not distributed); world_size: processes of the launch.
    Returns:
        (TrackerRuns, list of hooks); no hooks when only TensorBoard is named.
    Raises:
        UserInputError: a named tracker's package is not installed.
    """
    for name in cfg.REPORT_TO:
        if name != "tensorboard" and importlib.util.find_spec(name) is None:
            raise UserInputError("REPORT_TO names {!r}, whose package is not installed: pip install -r "
                                 "requirements-track.txt".format(name))
    runs = TrackerRuns()
    hooks = []
    for name in cfg.REPORT_TO:
        if name == "mlflow":
            from common.trackers.mlflow_run import MlflowTracker
            hooks.append(MlflowTracker(runs, cfg, cfg_path, folder, run_record, validation, rank, world_size))
        elif name == "wandb":
            from common.trackers.wandb_run import WandbTracker
            hooks.append(WandbTracker(runs, cfg, cfg_path, folder, run_record, validation, rank, world_size))
    return runs, hooks
