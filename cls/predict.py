"""The image-classification predictor: an image -> the top classes (names from the run's ``predictor.json``)."""
import torch

from common.checkpoint.run_files import RUN_INFO, read_run_info
from common.errors import UserInputError
from common.inference.inputs import top_predictions
from common.inference.predictor import TaskPredictor
from cls.data.augment import build_augment
from cls.data.datasets import ClassificationDataset


def class_names(info, num_classes, ckpt_path):
    """The class names of the run (``info["classes"]``), or ``'class N'`` for a run that recorded none.

    Raises:
        UserInputError: the recorded names are not ``num_classes`` long (NETWORK.NUM_CLASSES).
    """
    names = info.get("classes")
    if names is None:
        return ["class {}".format(i) for i in range(num_classes)]
    if len(names) != num_classes:
        raise UserInputError("{}: {} lists {} classes, but the config's NETWORK.NUM_CLASSES is {}".format(
            ckpt_path, RUN_INFO, len(names), num_classes))
    return [str(n) for n in names]


class ClsPredictor(TaskPredictor):
    """Input ``{"image"}``; output ``predictions``: classes by softmax probability, names from the training
    data set (recorded in the run folder's ``predictor.json``)."""
    fields = {}
    dataset_class = ClassificationDataset
    label_field = "label"

    def __init__(self, cfg, ckpt, ckpt_path, device):
        super().__init__(cfg, device)
        self.names = class_names(read_run_info(ckpt_path), cfg.NETWORK.NUM_CLASSES, ckpt_path)
        self.augment = build_augment(cfg, "test")

    @property
    def data_names(self):
        return list(ClassificationDataset.data_names)

    def item(self, image, inputs, index, name):
        # The label is a placeholder the inference loop takes out before the forward.
        return (self.augment(image), torch.tensor(-1), torch.tensor(index)), {}

    def decode(self, outputs, contexts, topk):
        probs = torch.softmax(outputs["label_logits"].float(), 1)
        return [dict(context, predictions=top_predictions(row, self.names, topk))
                for row, context in zip(probs, contexts)]
