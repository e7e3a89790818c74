"""cls evaluators: predictions CSV of the test split and the val figures, through the one inference loop
(:func:`common.inference.evaluation.inference_on_dataset`, fp32)."""
import csv
import io
import os

from common.fileio.safe_write import atomic_write
from common.inference.evaluation import IndexedPredictions
from common.runtime import distributed as cdist


class PredictionsCSV(IndexedPredictions):
    """Writes ``path``: a header ``index,label,predicted,top5`` then one row per image in data set order
    (``label`` the true class name, ``predicted`` the top-1 class name, ``top5`` the 5 best class names
    joined by ``|``), rank 0; ``evaluate()`` returns ``path``.

    Args:
        dataset: the :class:`cls.data.datasets.ClassificationDataset` split (``classes``, ``labels``).
    """

    def __init__(self, dataset, path):
        self.dataset, self.path = dataset, path
        self.reset()

    def forward(self, model, inputs):
        return model(*inputs.without("label")) if "label" in inputs.names else model(*inputs)

    def predict(self, inputs, outputs):
        logits = outputs["label_logits"].float()
        return logits.topk(min(5, logits.shape[1]), dim=1).indices

    def evaluate(self):
        top = self.predictions(len(self.dataset))
        if cdist.is_main_process():
            names = self.dataset.classes
            out = io.StringIO()
            writer = csv.writer(out, lineterminator="\n")
            writer.writerow(["index", "label", "predicted", "top5"])
            for i, (label, row) in enumerate(zip(self.dataset.labels.tolist(), top.tolist())):
                writer.writerow([i, names[label], names[row[0]], "|".join(names[j] for j in row)])
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            atomic_write(self.path, lambda f: f.write(out.getvalue()), binary=False)
        return self.path
