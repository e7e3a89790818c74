"""Reading back what a run reported to MLflow, for the tests."""
import os


def mlflow_runs(uri):
    """The runs of the MLflow store ``uri``, oldest first, and the client."""
    from common.trackers.mlflow_run import client

    store = client(uri)
    experiments = [e.experiment_id for e in store.search_experiments()]
    return store.search_runs(experiments, order_by=["attribute.start_time ASC"]), store


def mlflow_rows(store, run_id):
    """``{step: {figure: value}}`` of the run's metric histories; of several values logged at one step (a
    resumed run logs the steps past its checkpoint again) the last one, as the UI shows it."""
    rows = {}
    for key in store.get_run(run_id).data.metrics:
        for m in sorted(store.get_metric_history(run_id, key), key=lambda m: m.timestamp):
            rows.setdefault(m.step, {})[key] = m.value
    return rows


def default_store(folder):
    """The URI of the MLflow store a run in ``folder`` makes by default."""
    return "sqlite:///" + os.path.join(os.path.abspath(folder), "mlflow.db")
