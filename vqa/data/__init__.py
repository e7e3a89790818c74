"""VQA data. Importing ``vqa.data.vqa`` registers the 'vqa' dataset with ``common.data.build``; the
answer and file helpers import without it (``vqa/eval.py`` needs no torchvision)."""
