"""Tiny pretraining runs through the real entry point, ``pretrain/train_end2end.py``, for the tests.

Config: a shipped ``cfgs/pretrain/*.yaml`` with :func:`opts`: tiny sizes (2 layers of 32 units, ResNet-18
without dilation on 32-48 px images), the demo data in place of the data paths (every other value of
the config's DATASET entries stays), 2 samples per data set and batch, one epoch, fp32.

Inputs (:func:`make_inputs`): ``demo/make_demo_captions.py`` at a small size (the 11 photographs and
4 scenes for training, 2 scenes for validation), ``demo/make_demo_corpus.py``'s corpus, a tiny BERT
folder on the data's words and a random ResNet-18 with zero-init residuals.
"""
import json
import os
import runpy
import subprocess
import sys
from dataclasses import dataclass

import yaml

from tests import tiny_vcr

ROOT = tiny_vcr.ROOT
ENTRY = os.path.join(ROOT, "pretrain", "train_end2end.py")
CFG_DIR = os.path.join(ROOT, "cfgs", "pretrain")
# The training configs (vis_attention_maps_coco.yaml is for the attention-map script, not training).
CONFIGS = ("demo_e2e_cpu.yaml", "base_prec_4x16G_fp32.yaml", "base_prec_withouttextonly_4x16G_fp32.yaml",
           "base_e2e_16x16G_fp16.yaml",
           "large_prec_4x16G_fp16.yaml", "large_e2e_16x16G_fp16.yaml")
HIDDEN = tiny_vcr.HIDDEN
TRAIN_CAPTIONS = 11 + 4  # photographs + generated scenes


@dataclass
class Inputs:
    captions: str  # DATASET_PATH of conceptual_captions
    corpus: str    # the text corpus file
    bert: str      # NETWORK.BERT_MODEL_NAME
    resnet: str    # NETWORK.IMAGE_PRETRAINED (epoch 0)
    vocab_size: int


def cfg_path(name):
    return os.path.join(CFG_DIR, name)


def datasets(name, inputs):
    """The DATASET list (or mapping) of the shipped config ``name`` with the demo data's paths."""
    entries = shipped(name, "DATASET")
    single = isinstance(entries, dict)
    out = []
    for entry in [entries] if single else entries:
        entry = dict(entry)
        if entry["DATASET"] == "conceptual_captions":
            entry["DATASET_PATH"] = inputs.captions
        else:  # the corpus is one file: no folder
            entry["DATASET_PATH"] = ""
            for split in ("TRAIN", "VAL", "TEST"):
                entry[split + "_ANNOTATION_FILE"] = inputs.corpus
        out.append(entry)
    return out[0] if single else out


def opts(name, inputs, *dicts, **changes):
    """``--opts`` list of a tiny run of the shipped config ``name`` (``TRAIN__LR=0`` is ``TRAIN.LR 0``)."""
    data = datasets(name, inputs)
    per_set = 2 if isinstance(data, dict) else [2] * len(data)
    precomputed = shipped(name, "NETWORK")["IMAGE_FEAT_PRECOMPUTED"]
    values = {
        "DATASET": data, "SCALES": [32, 48], "NUM_WORKERS_PER_GPU": 0, "LOG_FREQUENT": 1,
        "NETWORK.BERT_MODEL_NAME": inputs.bert, "NETWORK.IMAGE_NUM_LAYERS": 18,
        "NETWORK.IMAGE_PRETRAINED": "" if precomputed else inputs.resnet, "NETWORK.IMAGE_PRETRAINED_EPOCH": 0,
        "NETWORK.IMAGE_C5_DILATED": False, "NETWORK.IMAGE_ROI_POOLED_SIZE": 4, "NETWORK.IMAGE_FINAL_DIM": HIDDEN,
        "NETWORK.VLBERT.hidden_size": HIDDEN, "NETWORK.VLBERT.visual_size": HIDDEN,
        "NETWORK.VLBERT.num_hidden_layers": 2, "NETWORK.VLBERT.num_attention_heads": 2,
        "NETWORK.VLBERT.intermediate_size": 64, "NETWORK.VLBERT.max_position_embeddings": 128,
        "NETWORK.VLBERT.vocab_size": inputs.vocab_size,
        "TRAIN.FP16": False, "TRAIN.END_EPOCH": 1, "TRAIN.WARMUP_STEPS": 2, "TRAIN.LR": 1e-4,
        "TRAIN.BATCH_IMAGES": per_set, "VAL.BATCH_IMAGES": per_set, "TEST.BATCH_IMAGES": per_set,
    }
    for d in dicts:
        values.update(d)
    values.update({k.replace("__", "."): v for k, v in changes.items()})
    out = []
    for key, value in values.items():
        out += [key, value if isinstance(value, str) else json.dumps(value)]
    return out


def shipped(name, key):
    """Value of the top-level ``key`` in the shipped config ``name``."""
    with open(cfg_path(name)) as f:
        return yaml.safe_load(f)[key]


def output_folder(model_dir, name):
    """The run's output folder (the config's OUTPUT_PATH under ``model_dir``; TRAIN_IMAGE_SET 'train')."""
    return os.path.join(str(model_dir), shipped(name, "OUTPUT_PATH"), name[:-5], "train_train")


def checkpoint_path(model_dir, name, epoch):
    prefix = shipped(name, "MODEL_PREFIX")
    return os.path.join(output_folder(model_dir, name), "{}-{:04d}.model".format(prefix, epoch))


def train(model_dir, name, run_opts, extra_args=()):
    """Train the shipped config ``name`` in this process through ``pretrain/train_end2end.py``; exit code."""
    return tiny_vcr.train_in_process(model_dir, run_opts, extra_args, entry=ENTRY, cfg=cfg_path(name))


def _vocabulary(captions, corpus):
    """BERT's special tokens, reserved ``[unused*]`` ids up to 999, then every lower-cased word of the captions
    (all splits) and the corpus."""
    from pytorch_pretrained_bert.tokenization import BasicTokenizer

    basic = BasicTokenizer(do_lower_case=True)
    words = set()
    for split in ("train", "val"):
        with open(os.path.join(captions, split + "_frcnn.json")) as f:
            for line in f:
                words.update(basic.tokenize(" ".join(json.loads(line)["caption"])))
    with open(corpus) as f:
        words.update(basic.tokenize(f.read()))
    specials = tiny_vcr.SPECIAL_TOKENS
    # words from id 1000 on, as in BERT's vocab: word_embedding_frozen keeps ids < 1000 trainable
    reserved = ["[unused{}]".format(i) for i in range(1000 - len(specials))]
    return specials + reserved + sorted(words - set(specials))


def make_inputs(root, train_scenes=4, val_scenes=2):
    """Write every input of the tiny runs under ``root``; returns :class:`Inputs`."""
    root = str(root)
    captions = os.path.join(root, "conceptual-captions")
    corpus = os.path.join(root, "en_corpus", "demo.doc")
    for script, args in (("make_demo_captions.py", ["--out", captions, "--train", str(train_scenes),
                                                    "--val", str(val_scenes)]),
                         ("make_demo_corpus.py", ["--out", corpus])):
        out = subprocess.run([sys.executable, os.path.join(ROOT, "demo", script)] + args,
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
    vocab = _vocabulary(captions, corpus)
    tiny_vcr._bert_folder(os.path.join(root, "bert"), vocab)
    resnet = os.path.join(root, "resnet18-zero-residual")
    runpy.run_path(os.path.join(ROOT, "bench", "smoke_paper_config.py"))["random_resnet_file"](resnet, 18)
    return Inputs(captions, corpus, os.path.join(root, "bert"), resnet, len(vocab))
