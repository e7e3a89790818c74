"""The paper's figure for each config of the reference release that the paper reports (VL-BERT, Su et al.,
ICLR 2020, arXiv:1908.08530: Table 2 VCR, Table 3 VQA, Table 4 RefCOCO+), in percent.

One table for the product and the docs: ``tools/results_table.py`` prints the figure beside a run's result,
and docs/fidelity.md ("The paper's figures") shows the same rows (a test keeps them equal). Configs are named by
their path under ``cfgs/`` without ``.yaml``; our validation metric of each is the same quantity on the split
given, except VQA, whose paper figure is test-dev (our ``SoftAcc`` is on the val split: compare with care).
"""
from typing import NamedTuple, Optional


class PaperFigure(NamedTuple):
    """``what``: the task and measure, ``split``: where the paper measured it, ``value``: percent."""
    what: str
    split: str
    value: float


PAPER_FIGURES = {
    "vcr/base_q2a_4x16G_fp32": PaperFigure("VCR Q->A accuracy", "val", 73.8),
    "vcr/base_q2a_4x16G_fp16": PaperFigure("VCR Q->A accuracy", "val", 73.8),
    "vcr/base_qa2r_4x16G_fp32": PaperFigure("VCR QA->R accuracy", "val", 74.4),
    "vcr/large_q2a_4x16G_fp16": PaperFigure("VCR Q->A accuracy", "val", 75.5),
    "vcr/large_q2a_16x16G_fp16": PaperFigure("VCR Q->A accuracy", "val", 75.5),
    "vcr/large_qa2r_4x16G_fp16": PaperFigure("VCR QA->R accuracy", "val", 77.9),
    "vcr/large_qa2r_16x16G_fp16": PaperFigure("VCR QA->R accuracy", "val", 77.9),
    "vqa/base_4x16G_fp32": PaperFigure("VQA accuracy", "test-dev", 71.16),
    "vqa/large_4x16G_fp32": PaperFigure("VQA accuracy", "test-dev", 71.79),
    "refcoco/base_gt_boxes_4x16G": PaperFigure("RefCOCO+ accuracy, ground-truth regions", "val", 79.88),
    "refcoco/base_detected_regions_4x16G": PaperFigure("RefCOCO+ accuracy, detected regions", "val", 71.60),
    "refcoco/large_gt_boxes_4x16G": PaperFigure("RefCOCO+ accuracy, ground-truth regions", "val", 80.31),
    "refcoco/large_detected_regions_4x16G": PaperFigure("RefCOCO+ accuracy, detected regions", "val", 72.59),
}


def config_name(path: str) -> str:
    """``'<task folder>/<file name without .yaml>'`` of a config path (``cfgs/vcr/x.yaml`` -> ``'vcr/x'``)."""
    parts = path.replace("\\", "/").rstrip("/").split("/")
    name = parts[-1][:-5] if parts[-1].endswith(".yaml") else parts[-1]
    return "/".join(parts[-2:-1] + [name])


def paper_figure(config_path: str) -> Optional[PaperFigure]:
    """The paper's figure of the config at ``config_path``, or None when the paper reports none for it."""
    return PAPER_FIGURES.get(config_name(config_path))
