"""Smoke run of the exact paper config for a few optimizer steps on the demo data: wall time and peak memory.

Runs ``./scripts/dist_run_single.sh NPROC vcr/train_end2end.py cfgs/vcr/base_q2a_4x16G_fp16.yaml`` with
random-init weights written here (``IMAGE_PRETRAINED`` a ResNet file with zero-init residuals, see
:func:`random_resnet_file`; ``PARTIAL_PRETRAIN ''``; ``BERT_MODEL_NAME`` a folder of randomly initialised
BERT-base weights: ``''`` would leave the data without a vocabulary) on
annotation files cut from data/demo: the training file has exactly
``STEPS x GRAD_ACCUMULATE_STEPS x BATCH_IMAGES x NPROC`` items, so the one epoch (``END_EPOCH 1``) makes
exactly STEPS optimizer steps; validation runs on one item per process. Every other key is the paper's
(ResNet-101 at 600 px, BERT-base, fp16 autocast: float16 on CPU too, which is slow).

Prints the wall time of the whole command (start-up, STEPS steps, validation, checkpoint) and the peak
memory of each training process: resident set size (CPU), and ``torch.cuda.max_memory_allocated`` on GPU.

Usage: python bench/smoke_paper_config.py [--nproc 1] [--steps 3] [--out output/smoke_paper]
Needs data/demo (demo/make_demo_data.py) and the MiniLM folder that scripts/run_demo.sh links, for its
vocabulary (the uncased BERT vocabulary of bert-base-uncased).
"""
import argparse
import itertools
import json
import os
import re
import resource
import runpy
import subprocess
import sys
import shutil
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = "cfgs/vcr/base_q2a_4x16G_fp16.yaml"
DEMO = os.path.join(REPO, "data", "demo")
VOCAB_FOLDER = os.path.join(REPO, "model", "pretrained_model", "all-MiniLM-L6-v2")
TAG = "[smoke-memory]"


def rank_main():
    """Inside one torchrun process: run vcr/train_end2end.py, then print this process's peak memory."""
    import torch

    sys.path.insert(0, os.path.join(REPO, "vcr"))
    sys.argv[0] = os.path.join(REPO, "vcr", "train_end2end.py")
    code = 0
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as e:
        code = e.code
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    cuda_mib = torch.cuda.max_memory_allocated() / 2 ** 20 if torch.cuda.is_available() else float("nan")
    print("{} rank {} peak RSS {:.0f} MiB, CUDA max allocated {:.0f} MiB".format(
        TAG, os.environ.get("RANK", "0"), rss_mib, cuda_mib), flush=True)
    sys.exit(code)


def cut_annotations(folder, num_train, num_val):
    """Write train/val jsonl files of the given sizes (cycling data/demo's items) next to its images."""
    os.makedirs(folder)
    os.symlink(os.path.join(DEMO, "vcr1images"), os.path.join(folder, "vcr1images"))
    for split, n in (("train", num_train), ("val", num_val)):
        with open(os.path.join(DEMO, split + ".jsonl")) as f:
            lines = [line for line in f if line.strip()]
        with open(os.path.join(folder, split + ".jsonl"), "w") as f:
            f.writelines(itertools.islice(itertools.cycle(lines), n))


def random_bert_folder(folder, vlbert):
    """A bert-base-uncased-like folder (vocab.txt, bert_config.json, pytorch_model.bin) with the random
    initialisation of pytorch-pretrained-bert's ``BertModel`` for the architecture of ``NETWORK.VLBERT``."""
    import torch
    from pytorch_pretrained_bert.modeling import BertConfig, BertModel

    os.makedirs(folder)
    shutil.copy(os.path.join(VOCAB_FOLDER, "vocab.txt"), folder)
    arch = {k: vlbert[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                   "intermediate_size", "hidden_act", "max_position_embeddings")}
    arch.update(type_vocab_size=2, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, initializer_range=0.02)
    with open(os.path.join(folder, "bert_config.json"), "w") as f:
        json.dump(arch, f, indent=2)
    torch.manual_seed(0)
    torch.save(BertModel(BertConfig.from_dict(arch)).state_dict(), os.path.join(folder, "pytorch_model.bin"))


def random_resnet_file(prefix, depth):
    """``{prefix}-0000.model``: a torchvision ResNet-``depth`` state dict with random weights and zero-init
    residuals (each block's last BN gain 0; Goyal et al. 2017, torchvision's ``zero_init_residual``).

    Plain random init is no use with the paper's frozen BN, which cannot rescale it: a random ResNet-101
    reaches 8e6 in res4 on a demo image, past float16's 65504, and every fp16 loss is NaN. With zero-init
    residuals each block starts as the identity and the activations stay within range.
    """
    import torch
    import torchvision

    torch.manual_seed(0)
    net = getattr(torchvision.models, "resnet{}".format(depth))(weights=None, zero_init_residual=True)
    torch.save(net.state_dict(), prefix + "-0000.model")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, default=1, help="processes (GPUs; the paper uses 4)")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps")
    parser.add_argument("--out", default=os.path.join("output", "smoke_paper"), help="parent of the run folder")
    args = parser.parse_args()
    sys.path.insert(0, REPO)
    from vcr.task import TASK

    cfg = TASK.load_config(os.path.join(REPO, CFG))
    per_step = cfg.TRAIN.GRAD_ACCUMULATE_STEPS * cfg.TRAIN.BATCH_IMAGES * args.nproc
    root = os.path.abspath(os.path.join(args.out, time.strftime("%Y%m%d-%H%M%S")))
    data = os.path.join(root, "data")
    cut_annotations(data, args.steps * per_step, args.nproc)
    bert = os.path.join(root, "bert-base-uncased")
    random_bert_folder(bert, cfg.NETWORK.VLBERT)
    resnet_prefix = os.path.join(root, "resnet{}-random".format(cfg.NETWORK.IMAGE_NUM_LAYERS))
    random_resnet_file(resnet_prefix, cfg.NETWORK.IMAGE_NUM_LAYERS)
    opts = ["DATASET.DATASET_PATH", data, "NETWORK.BERT_MODEL_NAME", bert, "NETWORK.IMAGE_PRETRAINED", resnet_prefix,
            "NETWORK.IMAGE_PRETRAINED_EPOCH", "0", "NETWORK.PARTIAL_PRETRAIN", "", "TRAIN.END_EPOCH", "1", "LOG_FREQUENT", "1"]
    print("{} optimizer steps of {} images ({} x {} x {} processes); config {}".format(
        args.steps, per_step, cfg.TRAIN.GRAD_ACCUMULATE_STEPS, cfg.TRAIN.BATCH_IMAGES, args.nproc, CFG), flush=True)
    cmd = ["./scripts/dist_run_single.sh", str(args.nproc), os.path.relpath(__file__, REPO), CFG,
           os.path.join(root, "model"), "--opts"] + opts
    env = dict(os.environ, SMOKE_RANK_WRAPPER="1")
    log_path = os.path.join(root, "train.log")
    start = time.time()
    with open(log_path, "w") as log:
        rc = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    seconds = time.time() - start
    with open(log_path) as f:
        text = f.read()
    for line in re.findall(re.escape(TAG) + r".*", text):
        print(line)
    print("exit code {}; wall time {:.0f} s for {} optimizer steps (log: {})".format(rc, seconds, args.steps, log_path))
    return rc


if __name__ == "__main__":
    if os.environ.get("SMOKE_RANK_WRAPPER") == "1":
        rank_main()
    else:
        sys.exit(main())
