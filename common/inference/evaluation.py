"""The one inference loop and its evaluator protocol (detectron2's ``inference_on_dataset`` and
``DatasetEvaluator``): epoch-end validation and every task's val and test scripts run through it.

    evaluator.reset()
    for batch in loader:                          # this rank's shard (an FSDP-sharded model: see below)
        outputs = evaluator.forward(model, inputs)    # fp32, eval mode, no grad; default model(*inputs)
        evaluator.process(batch, outputs)
    return evaluator.evaluate()                   # gathered over ranks where the evaluator needs it

The forward runs in fp32 (autocast off), whatever the training precision, so epoch-end validation and
the val/test scripts give the same predictions for the same weights (fp16/bf16 logits of close
candidates tie, and argmax then picks the first).

A model sharded by FSDP (:mod:`common.parallel.fsdp`) runs sharded forwards: each shard group all-gathers its
weights for its forward and frees them after, so no rank holds the whole model. Those all-gathers are
collectives, so every rank runs as many forwards as the rank with the most batches: a rank whose shard has
run out runs padding batches (its first batch again) whose outputs are dropped.
"""
import torch

from common.data.collate import to_device
from common.parallel.fsdp import is_sharded
from common.runtime import distributed as cdist

# Extra under which the loop hands the batch's label to the evaluator (see MetricEvaluator).
LABEL = "label"


class DatasetEvaluator:
    """What one evaluation computes from the model's outputs: a metric, predictions, a result file.

    ``process(inputs, outputs)`` gets the whole batch (:class:`common.data.collate.Batch`, fields by name,
    on the model's device; the label, if any, also as the extra ``label``) and the model's outputs dict.
    """

    def reset(self):
        """Forget the previous pass (called before each pass)."""

    def forward(self, model, inputs):
        """The model's outputs on ``inputs`` (the batch less the label); an evaluator may run several
        forwards per batch (VCR's QA->R test conditions on each answer)."""
        return model(*inputs)

    def process(self, inputs, outputs):
        """Take one batch's ``inputs`` and ``outputs``."""
        raise NotImplementedError

    def evaluate(self):
        """The pass's result (a dict of metrics, predictions, a written file's path: each evaluator says)."""
        raise NotImplementedError


class MetricEvaluator(DatasetEvaluator):
    """A metric (``reset()``, ``update(outputs)``, ``get_name_value()``; see :mod:`common.metrics`) as an
    evaluator: the batch's label goes into the outputs as ``label``. ``evaluate()`` returns
    ``dict(metric.get_name_value())`` (metrics that all-reduce give the same values on every rank)."""

    def __init__(self, metric):
        self.metric = metric

    def reset(self):
        self.metric.reset()

    def process(self, inputs, outputs):
        extras = getattr(inputs, "extras", {})  # a multi-task loader's batches are plain tuples
        if LABEL in extras:
            outputs["label"] = extras[LABEL]
        self.metric.update(outputs)

    def evaluate(self):
        return dict(self.metric.get_name_value())


class IndexedPredictions(DatasetEvaluator):
    """Base of evaluators that keep one prediction per dataset item, keyed by the batch's ``index`` extra
    (int64 ``(B,)`` dataset index, see :func:`common.data.collate.index_from_im_info`).

    Subclasses define :meth:`predict` (``(inputs, outputs)`` -> tensor ``(B, ...)``) and read
    :meth:`predictions`.
    """

    def reset(self):
        self._index, self._values = [], []

    def predict(self, inputs, outputs):
        """Tensor ``(B, ...)``: the prediction of each item of the batch."""
        raise NotImplementedError

    def process(self, inputs, outputs):
        self._index.append(inputs.field("index").detach().long().cpu())
        self._values.append(self.predict(inputs, outputs).detach().cpu())

    def predictions(self, size):
        """Every rank's predictions in dataset order, each item once: tensor ``(size, ...)`` on every rank.

        Raises:
            RuntimeError: the ranks together did not predict each of the ``size`` items.
        """
        empty = torch.zeros(0, dtype=torch.long)
        index, values = cdist.gather_predictions(torch.cat(self._index) if self._index else empty,
                                                 torch.cat(self._values) if self._values else empty)
        if not torch.equal(index, torch.arange(size)):
            raise RuntimeError("predictions cover {} of the {} items".format(len(index), size))
        return values


def _any_rank(flag, device):
    """Whether ``flag`` holds on any rank (a collective)."""
    value = torch.tensor([int(flag)], device=device)
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
    return bool(value.item())


def _first_item_batch(loader):
    """A batch of the loader's first item (a :class:`common.data.multitask.MultiTaskEvalLoader`: of each data
    set's), for a rank whose shard is empty; the item's random draws leave no trace on the run's RNG."""
    with torch.random.fork_rng(devices=[]):
        if hasattr(loader, "loaders"):
            return sum((tuple(part.collate_fn([part.dataset[0]])) for part in loader.loaders), ())
        return loader.collate_fn([loader.dataset[0]])


def _batches(loader, padded, device):
    """``(batch, True)`` for each batch of ``loader``; ``padded``: then, while another rank still has batches,
    ``(padding, False)`` with this rank's first batch (a batch of the data set's first item when it had none), so
    that the forwards of a sharded model, collectives, pair over the ranks (one all-reduce per batch decides)."""
    if not padded:
        for batch in loader:
            yield batch, True
        return
    iterator, first = iter(loader), None
    while True:
        batch = next(iterator, None)
        if not _any_rank(batch is not None, device):
            return
        if first is None:
            first = _first_item_batch(loader) if batch is None else batch
        yield (first, False) if batch is None else (batch, True)


@torch.no_grad()
def inference_on_dataset(model, loader, evaluator, label=None):
    """Run ``model`` over ``loader`` and return ``evaluator.evaluate()``.

    Args:
        model: the model, DDP-wrapped or FSDP-sharded or neither (unwrapped here; sharded: sharded forwards,
            every rank as many, see the module docstring); its training mode is restored afterwards.
        loader: iterable of :class:`common.data.collate.Batch`.
        evaluator: :class:`DatasetEvaluator`.
        label: the label field, taken out of the model's inputs and handed to the evaluator as the extra
            ``label``: a field name, or its position in the batch (DATASET.LABEL_INDEX_IN_BATCH of legacy
            configs, resolved by the batch's names); None: the batch has no separate label.
    Returns:
        what ``evaluator.evaluate()`` returns.
    """
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model = model.module
    was_training = model.training
    model.eval()
    evaluator.reset()
    device = next(model.parameters()).device
    padded = is_sharded(model) and cdist.get_world_size() > 1
    try:
        for batch, real in _batches(loader, padded, device):
            batch = to_device(batch, device)
            inputs = batch
            if label is not None:
                name = label if isinstance(label, str) else batch.names[label]
                batch.extras[LABEL] = batch.field(name)
                inputs = batch.without(name)
            outputs = evaluator.forward(model, inputs)
            if not real:
                continue  # a padding batch: its forwards paired with the other ranks', its outputs are dropped
            if isinstance(outputs, tuple):  # a model that returns (outputs, loss) in eval mode too
                outputs = outputs[0]
            evaluator.process(batch, outputs)
    finally:
        model.train(was_training)
    return evaluator.evaluate()
