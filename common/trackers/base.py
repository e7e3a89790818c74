"""The tracker hook: what every tracker reports, when, on which rank, and what happens when it fails."""
import os
from typing import Optional

import torch

from common.config.loader import to_plain
from common.hooks.tensorboard import TrainingScalars
from common.runtime.logs import get_logger

logger = get_logger(__name__)

TAG_KEYS = {"git_commit": ("git", "commit"), "git_dirty": ("git", "dirty"), "world_size": ("world_size",),
            "strategy": ("strategy",), "config_sha256": ("config_sha256",)}  # tag -> path in run.json


class TrackerRuns:
    """The run id of each tracker (``{'mlflow': '3f2a...', 'wandb': 'k2j4...'}``): saved in the checkpoint, so
    that a resumed run continues the tracker runs it had. Rank 0's ids, broadcast to every rank at start (each
    rank saves the same checkpoint state)."""

    def __init__(self):
        self.ids = {}

    def state_dict(self) -> dict:
        return dict(self.ids)

    def load_state_dict(self, state: dict) -> None:
        self.ids = dict(state)


def flat_config(cfg) -> dict:
    """The effective config as ``{dotted key: str(value)}`` (a ``DATASET`` list's entries as ``DATASET.0.KEY``)."""
    flat = {}

    def walk(prefix, value):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(prefix + str(k) + ".", v)
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for i, v in enumerate(value):
                walk(prefix + str(i) + ".", v)
        else:
            flat[prefix[:-1]] = str(value)
    walk("", to_plain(cfg))
    return flat


def run_tags(record: Optional[dict]) -> dict:
    """``run.json``'s git commit and dirty flag, world size, strategy and config sha256, as strings."""
    tags = {}
    for tag, path in TAG_KEYS.items():
        value = record or {}
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        tags[tag] = str(value)
    return tags


class TrackerHook(TrainingScalars):
    """Reports a run to one tracker from rank 0; a subclass implements the calls (:meth:`start`,
    :meth:`log_metrics`, :meth:`log_artifacts`, :meth:`finish`) and names itself (``name``, :meth:`where`).

    ``before_train``: the tracker run starts, or continues the one of the resumed checkpoint (its id in
    :class:`TrackerRuns`); the id goes into ``run.json`` under ``trackers``. Each log point: the figures
    TensorBoard writes, at its step. ``after_epoch``: the validation metrics (``Val-<name>`` at the epoch's
    last micro-batch index, as TensorBoard) and the artifacts (``config.yaml``, ``run.json``, ``curves.png``).
    Any exception of a tracker call logs one warning naming :meth:`where` and turns the tracker off for the
    rest of the run; training goes on.

    Args:
        runs: the shared :class:`TrackerRuns`.
        cfg, cfg_path, folder, run_record, validation, rank, world_size: see :func:`common.trackers.build_trackers`.
    """
    name = ""

    def __init__(self, runs, cfg, cfg_path, folder, run_record, validation, rank, world_size):
        super().__init__(cfg.LOG_FREQUENT)
        self.runs, self.cfg, self.folder = runs, cfg, folder
        self.experiment = os.path.splitext(os.path.basename(cfg_path))[0]
        self.run_record, self.validation = run_record, validation
        self.main = rank is None or rank == 0
        self.distributed = world_size > 1 and torch.distributed.is_initialized()
        self.alive = self.main

    def where(self) -> str:
        """The tracker and its address, for the warning line (e.g. ``MLflow at http://127.0.0.1:5000``)."""
        raise NotImplementedError

    def start(self, run_id: Optional[str], params: dict, tags: dict) -> str:
        """Start a tracker run (``run_id`` None) or continue run ``run_id``; log the params (first launch) and
        tags; return the run's id."""
        raise NotImplementedError

    def log_metrics(self, step: int, scalars: dict) -> None:
        """Log ``scalars`` (name -> float) at ``step`` (TensorBoard's x)."""
        raise NotImplementedError

    def log_artifacts(self, paths) -> None:
        """Upload the files ``paths`` (existing ones) to the run."""
        raise NotImplementedError

    def finish(self) -> None:
        """Mark the run finished (training ended normally)."""
        raise NotImplementedError

    def _call(self, fn, *args):
        """``fn(*args)`` on a live tracker; an exception turns it off with one warning line."""
        if not self.alive:
            return None
        try:
            return fn(*args)
        except Exception as e:  # a tracker's failure, whatever its kind, never stops training
            self.alive = False
            logger.warning("warning: %s failed (%s: %s); the run reports to it no more, training goes on "
                           "(TensorBoard and the log keep every figure)", self.where(), type(e).__name__,
                           str(e).splitlines()[0][:200] if str(e) else "")
            return None

    def before_train(self, ctx):
        run_id = self.runs.ids.get(self.name)
        if self.main:
            record = self.run_record.record
            run_id = self._call(self.start, run_id, flat_config(self.cfg), run_tags(record))
            if run_id is not None:
                self.run_record.set_tracker(self.name, {"run_id": run_id, "where": self.where()})
        if self.distributed:  # every rank saves rank 0's id in its checkpoint state
            box = [run_id]
            torch.distributed.broadcast_object_list(box, src=0)
            run_id = box[0]
        if run_id is not None:
            self.runs.ids[self.name] = run_id

    def report(self, ctx, step, scalars):
        if self.main:
            self._call(self.log_metrics, step, scalars)

    def after_epoch(self, ctx):
        if not self.main:
            return
        if self.validation.validated:
            self._call(self.log_metrics, (ctx.epoch + 1) * ctx.batches_per_epoch - 1,
                       {"Val-" + k: float(v) for k, v in self.validation.values.items()})
        if ctx.writer is not None:
            ctx.writer.flush()  # the curves read the events written so far
        self._call(self._log_epoch_files)

    def _log_epoch_files(self) -> None:
        """``config.yaml``, ``run.json`` and ``curves.png``, drawn now from the run's TensorBoard events
        (tools/plot_curves.py's panels; none without TensorBoard), as artifacts."""
        from common.diagnostics.curves import plot
        from common.diagnostics.tb_events import read_scalars

        paths = [os.path.join(self.folder, "config.yaml"), os.path.join(self.folder, "run.json")]
        events = os.path.join(self.folder, "tensorboard_logs")
        if os.path.isdir(events):
            paths.append(os.path.join(self.folder, "curves.png"))
            plot(read_scalars(events), paths[-1])
        self.log_artifacts(paths)

    def after_train(self, ctx):
        if self.main:
            self._call(self.finish)
