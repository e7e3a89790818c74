"""Several metrics behind one ``update`` / ``get`` / ``reset``."""
from .eval_metric import EvalMetric


class CompositeEvalMetric(EvalMetric):
    """Holds child metrics; ``get()`` returns ``(names, values)`` lists in the order they were added."""

    def __init__(self, metrics=None, name: str = "composite"):
        self.metrics = list(metrics or [])
        super().__init__(name, allreduce=False)

    def add(self, metric: EvalMetric) -> None:
        self.metrics.append(metric)

    def get_metric(self, index: int) -> EvalMetric:
        """The child at ``index``.

        Raises:
            IndexError: index outside ``[0, len(metrics))``.
        """
        if not 0 <= index < len(self.metrics):
            raise IndexError("metric index {} is outside [0, {})".format(index, len(self.metrics)))
        return self.metrics[index]

    def update(self, outputs: dict) -> None:
        for metric in self.metrics:
            metric.update(outputs)

    def reset(self) -> None:
        for metric in self.metrics:
            metric.reset()

    def get(self):
        names, values = [], []
        for metric in self.metrics:
            name, value = metric.get()
            names.extend(name if isinstance(name, list) else [name])
            values.extend(value if isinstance(value, list) else [value])
        return names, values
