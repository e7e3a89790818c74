"""Tiny VCR inputs for the fault tests: demo data (demo/make_demo_data.py) and a generated BERT folder.

The BERT folder (vocab.txt of the data's words, bert_config.json, random pytorch_model.bin) keeps the
VCR model at a 32-wide, 1-layer encoder, so a run through vcr/train_end2end.py takes seconds on CPU.
"""
import json
import os
import subprocess
import sys

import torch
from pytorch_pretrained_bert.modeling import BertConfig, BertModel

from tests.conftest import ROOT

CFG = os.path.join(ROOT, "cfgs", "vcr", "demo_q2a_cpu.yaml")
# BERT's layout of the first 1000 ids (VL-BERT keeps them trainable when word embeddings are frozen).
SPECIAL = (["[PAD]"] + ["[unused{}]".format(i) for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
           + ["[unused{}]".format(i) for i in range(99, 995)])
BERT = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=512, hidden_act="gelu")


def _words(data):
    words = set()
    for split in ("train", "val", "test"):
        with open(os.path.join(data, split + ".jsonl")) as f:
            for line in f:
                ann = json.loads(line)
                for text in [ann["question"]] + ann["answer_choices"] + ann["rationale_choices"]:
                    words.update(t.lower() for t in text if isinstance(t, str))
    return sorted(words)


def write_bert_folder(folder, data):
    """A random 1-layer BERT whose vocabulary holds the data's words; returns ``--opts`` matching it."""
    os.makedirs(folder, exist_ok=True)
    vocab = SPECIAL + _words(data)
    with open(os.path.join(folder, "vocab.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")
    config = dict(BERT, vocab_size=len(vocab), type_vocab_size=2)
    with open(os.path.join(folder, "bert_config.json"), "w") as f:
        json.dump(config, f)
    torch.manual_seed(0)
    model = BertModel(BertConfig(len(vocab), **{k: v for k, v in config.items() if k != "vocab_size"}))
    torch.save(model.state_dict(), os.path.join(folder, "pytorch_model.bin"))
    opts = []
    for key, value in dict(BERT, vocab_size=len(vocab), visual_size=32).items():
        opts += ["NETWORK.VLBERT." + key, str(value)]
    return opts + ["NETWORK.IMAGE_FINAL_DIM", "32"]


def make_tiny_vcr(root):
    """Demo data (val and test: the 4 generated scenes) and a BERT folder under ``root``; returns the
    ``--opts`` of a fast 1-epoch run on small images."""
    data, bert = os.path.join(root, "data"), os.path.join(root, "bert")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "demo", "make_demo_data.py"), "--out", data,
                          "--train", "4", "--val", "4", "--test", "4"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for split in ("val", "test"):  # the 4 generated scenes only, not the 11 photographs
        path = os.path.join(data, split + ".jsonl")
        with open(path) as f:
            lines = [line for line in f if '"annot_id": "shapes-' in line]
        with open(path, "w") as f:
            f.writelines(lines)
    return ["DATASET.DATASET_PATH", data, "NETWORK.BERT_MODEL_NAME", bert, "TRAIN.END_EPOCH", "1",
            "TRAIN.BATCH_IMAGES", "4", "VAL.BATCH_IMAGES", "4", "TEST.BATCH_IMAGES", "4", "NUM_WORKERS_PER_GPU", "0",
            "LOG_FREQUENT", "1", "SCALES", "[48, 80]"] + write_bert_folder(bert, data)
