"""MLflow: a run per training run, continued across resumes, in a SQLite store in the run folder unless
``MLFLOW_TRACKING_URI`` names another (a server). Imported only when ``REPORT_TO`` holds 'mlflow'."""
import os
import pathlib
import time

from common.runtime.logs import get_logger
from common.trackers.base import TrackerHook

logger = get_logger(__name__)

DB = "mlflow.db"  # the default store, in the run folder
ARTIFACTS = "mlartifacts"  # the default store's artifact folder, in the run folder
# A server that does not answer costs at most a few seconds per call (the client's defaults are 120 s and 7
# retries with backoff, minutes per call); a user's own setting of these variables wins.
HTTP_LIMITS = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "5", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
               "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
BATCH = 100  # params / tags per log_batch call (MLflow's limit)
PARAM_LENGTH = 6000  # characters of a param value MLflow keeps


def client(uri: str):
    """An ``mlflow.tracking.MlflowClient`` of the store ``uri``, each HTTP call bounded (:data:`HTTP_LIMITS`)."""
    for key, value in HTTP_LIMITS.items():
        os.environ.setdefault(key, value)
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def tracking_uri(folder: str) -> str:
    """``MLFLOW_TRACKING_URI`` when set, else ``sqlite:///<folder>/mlflow.db`` (absolute)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///" + os.path.join(os.path.abspath(folder), DB)


class MlflowTracker(TrackerHook):
    """See :class:`common.trackers.base.TrackerHook`. Experiment: the config file's name; run name: the run
    folder's; params: the effective config, flattened (a resumed run adds the keys its run lacks, and keeps the
    first launch's values, which MLflow does not let change); metrics with TensorBoard's steps; artifacts under
    ``<run folder>/mlartifacts`` with the default store. A resumed run logs the steps past its checkpoint again,
    with the same values (resume is exact), later in time."""
    name = "mlflow"

    def __init__(self, *args):
        super().__init__(*args)
        self.uri = tracking_uri(self.folder)
        self.client = self.run_id = None

    def where(self):
        return "MLflow at {}".format(self.uri)

    def start(self, run_id, params, tags):
        self.client = client(self.uri)
        from mlflow.entities import Param, RunTag
        from mlflow.exceptions import MlflowException

        run = None
        if run_id is not None:
            try:
                run = self.client.get_run(run_id)
            except MlflowException:  # another store than the checkpoint's run was in
                logger.warning("warning: MLflow run %s of the checkpoint is not in %s; starting a new run",
                               run_id, self.uri)
        if run is None:
            experiment = self.client.get_experiment_by_name(self.experiment)
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(
                self.experiment, artifact_location=self._artifact_location())
            run = self.client.create_run(experiment_id, run_name=os.path.basename(os.path.normpath(self.folder)))
        else:
            self.client.update_run(run.info.run_id, status="RUNNING")
        self.run_id = run.info.run_id
        params = [Param(k, v[:PARAM_LENGTH]) for k, v in params.items() if k not in run.data.params]
        tags = [RunTag(k, v) for k, v in dict(tags, run_folder=os.path.abspath(self.folder)).items()]
        for i in range(0, max(len(params), len(tags)), BATCH):
            self.client.log_batch(self.run_id, params=params[i:i + BATCH], tags=tags[i:i + BATCH])
        return self.run_id

    def _artifact_location(self):
        """The run folder's ``mlartifacts`` with the default store (MLflow's own default is ./mlruns of the
        working directory); the server's or the store's default otherwise."""
        if os.environ.get("MLFLOW_TRACKING_URI"):
            return None
        return pathlib.Path(os.path.abspath(self.folder), ARTIFACTS).as_uri()

    def log_metrics(self, step, scalars):
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in scalars.items()])

    def log_artifacts(self, paths):
        for path in paths:
            if path and os.path.isfile(path):
                self.client.log_artifact(self.run_id, path)

    def finish(self):
        self.client.set_terminated(self.run_id, "FINISHED")
