"""Tiny VCR training runs through the real entry point, ``vcr/train_end2end.py``, for the tests.

Config: the shipped paper config ``cfgs/vcr/base_q2a_4x16G_fp16.yaml`` (clipping at 10, SGD with
a warmed-up step schedule, frozen ResNet stages 1-2 and frozen BN, the partial pretrain prefix
changes, CNN regularisation loss, the whole image as a box, AUTO_RESUME, ...) with
:data:`TINY_OPTS`: tiny sizes, one epoch of 4 optimizer steps (k = 2 instead of 4), a 1-item
validation set, and fp32 (fp16 autocast on a CPU runs a slow convolution; the fp16 tests set it).

Inputs (:func:`make_inputs`, made once per test session):

* data: ``demo/make_demo_data.py`` at its smallest (16 training items, 11 of them on the
  photographs) plus the zip of the images (ZIP_MODE); 2 training scenes are padded to portrait
  so that ASPECT_GROUPING has two groups; ``train_same_size.jsonl`` holds 8 items on square
  scenes of one size (no padding in a batch: equal sums for any batch split);
* a tiny BERT folder: the data's words as vocabulary, 2 layers of 32 units, random weights;
* a ResNet-18 weights file with zero-init residuals (``bench/smoke_paper_config.py`` says why);
* e2e pretraining checkpoints of the tiny architecture, without and with the relationship head.
"""
import itertools
import json
import os
import runpy
import subprocess
import sys
from dataclasses import dataclass

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENTRY = os.path.join(ROOT, "vcr", "train_end2end.py")
CFG = os.path.join(ROOT, "cfgs", "vcr", "base_q2a_4x16G_fp16.yaml")
PREFIX = "vl-bert_base_a_res101"  # MODEL_PREFIX of CFG
PORTRAIT_SCENES = ("train_00000", "train_00001")  # 4 of the 16 training items
SAME_SIZE_FILE = "train_same_size.jsonl"
# Environment of launched runs: one thread per process (2 cores shared by the test processes).
LAUNCH_ENV = {"OMP_NUM_THREADS": "1"}
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
HIDDEN = 32


@dataclass
class Inputs:
    data: str          # DATASET_PATH with the image folder
    zip_data: str      # DATASET_PATH with vcr1images.zip only (no folder)
    bert: str          # NETWORK.BERT_MODEL_NAME
    resnet: str        # NETWORK.IMAGE_PRETRAINED (epoch 0)
    pretrain_e2e: str  # pretraining checkpoint without relationship head
    pretrain_rel: str  # pretraining checkpoint with relationship head
    vocab_size: int

    def opts(self, *dicts, **changes):
        """``--opts`` list: :data:`TINY_OPTS` for these inputs, then the ``dicts`` (``{'TRAIN.LR': 0}``),
        then ``changes`` (``TRAIN__LR=0`` is ``TRAIN.LR 0``)."""
        values = dict(TINY_OPTS)
        values.update({"DATASET.DATASET_PATH": self.data, "NETWORK.BERT_MODEL_NAME": self.bert,
                       "NETWORK.IMAGE_PRETRAINED": self.resnet, "NETWORK.VLBERT.vocab_size": self.vocab_size})
        for d in dicts:
            values.update(d)
        values.update({k.replace("__", "."): v for k, v in changes.items()})
        out = []
        for key, value in values.items():  # compact JSON: a value stays one word in a shell word list (PY_ARGS)
            out += [key, value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))]
        return out


# No dropout: runs that split the same batches differently reach the same weights.
NO_DROPOUT = {"NETWORK.VLBERT.hidden_dropout_prob": 0.0, "NETWORK.VLBERT.attention_probs_dropout_prob": 0.0,
              "NETWORK.CLASSIFIER_DROPOUT": 0.0}
# The accumulation runs: 8 same-size items, 2 epochs, triangle schedule; BATCH_IMAGES and
# GRAD_ACCUMULATE_STEPS (or the number of processes) are set by each run.
ACCUMULATION_OPTS = dict(NO_DROPOUT, **{"DATASET.TRAIN_ANNOTATION_FILE": SAME_SIZE_FILE, "TRAIN.END_EPOCH": 2,
                                        "TRAIN.LR_SCHEDULE": "triangle"})

# The paper config's sizes made tiny; every other key stays the paper's.
TINY_OPTS = {
    "SCALES": [32, 48], "NUM_WORKERS_PER_GPU": 0, "LOG_FREQUENT": 1,
    "NETWORK.PARTIAL_PRETRAIN": "", "NETWORK.IMAGE_NUM_LAYERS": 18, "NETWORK.IMAGE_PRETRAINED_EPOCH": 0,
    # res5 on 4 x 4 RoI crops without dilation (2 x 2 out), as the demo: 14 x 14 dilated costs 50x more
    "NETWORK.IMAGE_C5_DILATED": False, "NETWORK.IMAGE_ROI_POOLED_SIZE": 4, "DATASET.MASK_SIZE": 2,
    "NETWORK.IMAGE_FINAL_DIM": HIDDEN, "NETWORK.CLASSIFIER_HIDDEN_SIZE": HIDDEN,
    "NETWORK.VLBERT.hidden_size": HIDDEN, "NETWORK.VLBERT.visual_size": HIDDEN,
    "NETWORK.VLBERT.num_hidden_layers": 2, "NETWORK.VLBERT.num_attention_heads": 2,
    "NETWORK.VLBERT.intermediate_size": 64, "NETWORK.VLBERT.max_position_embeddings": 128,
    "TRAIN.FP16": False, "TRAIN.BATCH_IMAGES": 2, "TRAIN.GRAD_ACCUMULATE_STEPS": 2, "TRAIN.END_EPOCH": 1,
    "TRAIN.LR_STEP": "0.5", "TRAIN.WARMUP_STEPS": 2, "DATASET.VAL_ANNOTATION_FILE": "val_shapes.jsonl",
    "VAL.BATCH_IMAGES": 2, "TEST.BATCH_IMAGES": 2,
}


def output_folder(model_dir):
    """The run's output folder for ``--model-dir model_dir`` (OUTPUT_PATH of the paper config)."""
    return os.path.join(str(model_dir), "output", "vl-bert", "vcr", os.path.basename(CFG)[:-5], "vcr1images_train")


def checkpoint(model_dir, epoch):
    """The epoch checkpoint dict of a run (``epoch`` 0-based)."""
    path = os.path.join(output_folder(model_dir), "{}-{:04d}.model".format(PREFIX, epoch))
    return torch.load(path, map_location="cpu", weights_only=True)


def log_text(model_dir):
    """Text of the run's log file(s) in the output folder (one per start)."""
    return log_text_in(output_folder(model_dir))


def log_text_in(folder):
    """Text of the log file(s) in the output folder ``folder`` (one per start)."""
    names = sorted(n for n in os.listdir(folder) if n.endswith(".log"))
    assert names, "no .log file in {}".format(folder)
    return "".join(open(os.path.join(folder, n)).read() for n in names)


def tensorboard_scalars(model_dir):
    """``{tag: [(step, value), ...]}`` as TensorBoard shows a run's scalars (:func:`tensorboard_scalars_in`)."""
    return tensorboard_scalars_in(output_folder(model_dir))


def tensorboard_scalars_in(output):
    """``{tag: [(step, value), ...]}`` as TensorBoard shows the scalars of the run in the output folder
    ``output`` (see :func:`common.diagnostics.tb_events.read_scalars`)."""
    from common.diagnostics.tb_events import read_scalars

    return read_scalars(os.path.join(output, "tensorboard_logs"))


def predictor_inputs(data, split="test"):
    """The items of ``<data>/<split>.jsonl`` (VCR layout) as :class:`common.inference.Predictor` inputs (image path,
    question, answers, rationales, boxes, objects, segms). Returns (annotations, inputs)."""
    with open(os.path.join(data, split + ".jsonl")) as f:
        anns = [json.loads(line) for line in f if line.strip()]
    inputs = []
    for ann in anns:
        with open(os.path.join(data, "vcr1images", ann["metadata_fn"])) as f:
            meta = json.load(f)
        inputs.append({"image": os.path.join(data, "vcr1images", ann["img_fn"]), "question": ann["question"],
                       "answers": ann["answer_choices"], "rationales": ann["rationale_choices"],
                       "boxes": meta["boxes"], "objects": ann["objects"], "segms": meta.get("segms")})
    return anns, inputs


def run_script(entry, argv):
    """``python <entry> argv...`` run in this process (its ``__main__`` through runpy: no interpreter
    start-up), on one thread as the launched runs (OMP_NUM_THREADS=1): the same arithmetic, no
    oversubscription. Returns the exit code (0 when it returns without SystemExit)."""
    torch.set_num_threads(1)
    saved = sys.argv
    sys.argv = [entry] + list(argv)
    if os.path.dirname(entry) not in sys.path:
        sys.path.insert(0, os.path.dirname(entry))  # for its `import _init_paths`
    try:
        runpy.run_path(entry, run_name="__main__")
        return 0
    except SystemExit as e:
        return e.code
    finally:
        sys.argv = saved


def train_in_process(model_dir, opts, extra_args=(), entry=ENTRY, cfg=CFG):
    """``python vcr/train_end2end.py --cfg CFG --model-dir model_dir [extra_args] --opts ...`` (or another
    ``entry`` script and ``cfg`` file) through :func:`run_script`. Returns the exit code."""
    return run_script(entry, ["--cfg", cfg, "--model-dir", str(model_dir)] + list(extra_args) + ["--opts"] + list(opts))


def train_recording_orientations(model_dir, opts):
    """:func:`train_in_process`, also returning the orientation (0: width >= height, 1: portrait) of the
    images of each training batch, read from its ``im_info`` (last in a VCR batch: width, height, ...)
    as the training loader's collate function makes it.

    Returns:
        (exit code, list of lists of 0/1).
    """
    import common.engine

    batches = []
    real = common.engine.make_dataloader

    def make_dataloader(cfg, mode="train", *args, **kwargs):
        loader = real(cfg, mode, *args, **kwargs)
        if mode == "train":
            collate = loader.collate_fn

            def recording_collate(items):
                batch = collate(items)
                batches.append([int(w < h) for w, h in batch[-1][:, :2].tolist()])
                return batch
            loader.collate_fn = recording_collate
        return loader
    common.engine.make_dataloader = make_dataloader
    try:
        return train_in_process(model_dir, opts), batches
    finally:
        common.engine.make_dataloader = real


def launch_command(script, model_dir, opts, nprocs=1, extra_args=()):
    """The launch script command line (nondist_run.sh, or dist_run_single.sh for ``nprocs`` > 1)."""
    if nprocs == 1:
        cmd = [os.path.join(ROOT, "scripts", "nondist_run.sh"), script, CFG, str(model_dir)]
    else:
        cmd = [os.path.join(ROOT, "scripts", "dist_run_single.sh"), str(nprocs), script, CFG, str(model_dir)]
    return cmd + list(extra_args) + ["--opts"] + list(opts)


# ------------------------------------------------------------------------------------------------ #
# Inputs
# ------------------------------------------------------------------------------------------------ #
def _pad_to_portrait(data, scene):
    """Pad a 96 x 96 scene to 96 wide x 128 high (gray rows below; boxes unchanged)."""
    from PIL import Image

    stem = os.path.join(data, "vcr1images", "shapes", scene)
    image = Image.open(stem + ".jpg")
    tall = Image.new("RGB", (image.width, image.height + 32), (128, 128, 128))
    tall.paste(image, (0, 0))
    tall.save(stem + ".jpg", quality=95)
    with open(stem + ".json") as f:
        meta = json.load(f)
    meta["height"] = tall.height
    with open(stem + ".json", "w") as f:
        json.dump(meta, f)


def _vocabulary(data):
    """Special tokens, then every lower-cased word and punctuation mark of the data's text."""
    from pytorch_pretrained_bert.tokenization import BasicTokenizer
    from vcr.data.vcr import GENDER_NEUTRAL_NAMES

    basic = BasicTokenizer(do_lower_case=True)
    words = set()
    for split in ("train", "val", "test"):
        with open(os.path.join(data, split + ".jsonl")) as f:
            for line in f:
                item = json.loads(line)
                texts = [item["question"]] + item["answer_choices"] + item["rationale_choices"]
                words.update(item["objects"])
                for tokens in texts:
                    for t in tokens:
                        if isinstance(t, str):
                            words.update(basic.tokenize(t))
    words.update(basic.tokenize(" ".join(GENDER_NEUTRAL_NAMES)))
    return SPECIAL_TOKENS + sorted(words - set(SPECIAL_TOKENS))


def _bert_folder(folder, vocab, **arch_changes):
    """vocab.txt, bert_config.json and pytorch_model.bin of a random 2-layer BERT of :data:`TINY_OPTS`, or of
    another architecture with ``arch_changes`` (``hidden_size=384``: bert_config.json's keys)."""
    from pytorch_pretrained_bert.modeling import BertConfig, BertModel

    os.makedirs(folder)
    with open(os.path.join(folder, "vocab.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")
    arch = {"vocab_size": len(vocab), "hidden_size": HIDDEN, "num_hidden_layers": 2, "num_attention_heads": 2,
            "intermediate_size": 64, "hidden_act": "gelu", "max_position_embeddings": 128, "type_vocab_size": 2,
            "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "initializer_range": 0.02}
    arch.update(arch_changes)
    with open(os.path.join(folder, "bert_config.json"), "w") as f:
        json.dump(arch, f)
    torch.manual_seed(0)
    torch.save(BertModel(BertConfig.from_dict(arch)).state_dict(), os.path.join(folder, "pytorch_model.bin"))


def _pretrain_checkpoint(path, inputs, cfg_name, with_rel_head):
    """A reference-style pretraining checkpoint (DataParallel ``module.`` keys, fp16 floats) of the tiny
    architecture, every tensor random (unlike any fresh init)."""
    from pretrain.task import TASK as PRETRAIN_TASK
    from pretrain.modules import MODELS

    opts = _network_opts(inputs.opts()) + ["NETWORK.WITH_REL_LOSS", with_rel_head, "NETWORK.IMAGE_PRETRAINED", ""]
    cfg = PRETRAIN_TASK.load_config(os.path.join(ROOT, "cfgs", "pretrain", cfg_name), opts)
    torch.manual_seed(1)
    model = MODELS.build(cfg)
    g = torch.Generator().manual_seed(2)
    random = {}  # per tensor: res5 is one module under two names, with one value in a real file
    for k, v in model.state_dict().items():
        if v.is_floating_point() and v.data_ptr() not in random:
            random[v.data_ptr()] = torch.randn(v.shape, generator=g).half()
    state = {"module." + k: random[v.data_ptr()] if v.is_floating_point() else v
             for k, v in model.state_dict().items()}
    torch.save({"state_dict": state}, path)


def _network_opts(opts):
    """The NETWORK.* pairs of an --opts list (the architecture), for building the pretraining model."""
    pairs = list(zip(opts[::2], opts[1::2]))
    return [x for k, v in pairs if k.startswith("NETWORK.") and k != "NETWORK.PARTIAL_PRETRAIN" for x in (k, v)]


def make_inputs(root):
    """Write every input of the tiny runs under ``root`` (about 15 s); returns :class:`Inputs`."""
    import shutil
    import warnings

    random_resnet_file = runpy.run_path(os.path.join(ROOT, "bench", "smoke_paper_config.py"))["random_resnet_file"]
    root = str(root)
    data = os.path.join(root, "data")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "demo", "make_demo_data.py"), "--out", data,
                          "--train", "5", "--val", "1", "--test", "1"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for scene in PORTRAIT_SCENES:
        _pad_to_portrait(data, scene)
    with open(os.path.join(data, "train.jsonl")) as f:
        square = [line for line in f if '"shapes/' in line and not any(s in line for s in PORTRAIT_SCENES)]
    with open(os.path.join(data, SAME_SIZE_FILE), "w") as f:
        f.writelines(itertools.islice(itertools.cycle(square), 8))
    zip_data = os.path.join(root, "zip_data")
    os.makedirs(zip_data)
    for name in os.listdir(data):
        if name.endswith(".jsonl"):
            shutil.copy(os.path.join(data, name), zip_data)
    shutil.make_archive(os.path.join(zip_data, "vcr1images"), "zip", data, "vcr1images")  # VCR's zip layout

    vocab = _vocabulary(data)
    _bert_folder(os.path.join(root, "bert"), vocab)
    resnet = os.path.join(root, "resnet18-zero-residual")
    random_resnet_file(resnet, 18)
    inputs = Inputs(data, zip_data, os.path.join(root, "bert"), resnet, os.path.join(root, "vl-bert-e2e.model"),
                    os.path.join(root, "vl-bert-e2e-rel.model"), len(vocab))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # random-init warnings of the model builders
        _pretrain_checkpoint(inputs.pretrain_e2e, inputs, "base_e2e_16x16G_fp16.yaml", False)
        _pretrain_checkpoint(inputs.pretrain_rel, inputs, "base_e2e_16x16G_fp16.yaml", True)
    return inputs
