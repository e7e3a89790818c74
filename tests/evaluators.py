"""Evaluators for tests that compare a model's raw outputs over a whole loader (predictor vs test.py, the
simulated GPU vs the CPU, FSDP vs DDP)."""
import torch

from common.inference.evaluation import DatasetEvaluator


class OutputRows(DatasetEvaluator):
    """Every batch's output ``name`` (``[batch, ...]``), as float32 on the CPU, concatenated in loader order."""

    def __init__(self, name):
        self.name = name

    def reset(self):
        self.rows = []

    def process(self, inputs, outputs):
        self.rows.append(outputs[self.name].float().cpu())

    def evaluate(self):
        return torch.cat(self.rows)
