"""Inputs of bench/gpu_suite.py's training runs, made at run time the way the tests make theirs (nothing is
downloaded, every weight file is random): per task the tiny data, BERT folder and ResNet-18 file of
``tests/tiny_*.py`` and ``tests/refcoco_fixture.py``, and for the VCR agreement run the demo data of
``demo/make_demo_data.py`` with a random BERT of the demo config's architecture.

    python bench/gpu_suite_inputs.py ROOT [--demo-train N]

writes them under ``ROOT`` and ``ROOT/runs.json``: ``{name: {"entry": script, "cfg": yaml, "opts": [...]}}`` for
``vcr``, ``vqa``, ``refcoco``, ``pretrain``, ``cls`` (one epoch of 2 optimizer steps each) and ``agree`` (the VCR
demo config, one epoch).
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

PRETRAIN_CFG = "base_e2e_16x16G_fp16.yaml"
CLS_CFG = "vit_base16_cifar100_1x24G_fp16"
DEMO_CFG = os.path.join(ROOT, "cfgs", "vcr", "demo_q2a_cpu.yaml")


def entry(task):
    return os.path.join(ROOT, task, "train_end2end.py")


def task_runs(root):
    """The tiny run of each task: {task: {"entry", "cfg", "opts"}}. GRAD_ACCUMULATE_STEPS is set so that one
    epoch is 2 optimizer steps, and the resumed run of bench/gpu_suite.py (one epoch more) 2 steps too."""
    from tests import tiny_pretrain, tiny_vcr, tiny_vqa
    from tests.refcoco_fixture import tiny_opts as refcoco_opts, write_refcoco
    from tests.tiny_cls import opts as cls_opts

    sys.path.insert(0, os.path.join(ROOT, "demo"))
    import make_cls_demo_data

    vcr = tiny_vcr.make_inputs(os.path.join(root, "vcr"))  # 16 items, 2 images x 4 micro-batches a step
    vqa = tiny_vqa.make_inputs(os.path.join(root, "vqa"))  # 8 questions, 2 x 2
    tiny_vqa.write_images(vqa)  # the photographs too, for an image encoder's run (the ViT's)
    refcoco = write_refcoco(os.path.join(root, "refcoco"))  # 4 expressions, 1 x 2
    pretrain = tiny_pretrain.make_inputs(os.path.join(root, "pretrain"))  # 15 captions, 2 x 4
    cls = make_cls_demo_data.write(os.path.join(root, "cls"), train=16, test=4)  # 16 images, 2 x 4
    return {
        "vcr": {"entry": entry("vcr"), "cfg": tiny_vcr.CFG, "opts": vcr.opts(TRAIN__GRAD_ACCUMULATE_STEPS=4)},
        "vqa": {"entry": entry("vqa"), "cfg": tiny_vqa.CFGS["base_4x16G_fp32"],
                "opts": vqa.opts(TRAIN__GRAD_ACCUMULATE_STEPS=2)},
        "refcoco": {"entry": entry("refcoco"), "cfg": os.path.join(ROOT, "cfgs", "refcoco", "base_gt_boxes_4x16G.yaml"),
                    "opts": refcoco_opts(vcr, refcoco, "", TRAIN__END_EPOCH=1, TRAIN__GRAD_ACCUMULATE_STEPS=2)},
        "pretrain": {"entry": entry("pretrain"), "cfg": tiny_pretrain.cfg_path(PRETRAIN_CFG),
                     "opts": tiny_pretrain.opts(PRETRAIN_CFG, pretrain, TRAIN__GRAD_ACCUMULATE_STEPS=4)},
        "cls": {"entry": entry("cls"), "cfg": os.path.join(ROOT, "cfgs", "cls", CLS_CFG + ".yaml"),
                "opts": cls_opts(cls, CLS_CFG)},
    }


def agreement_run(root, train):
    """The VCR demo config on ``demo/make_demo_data.py --train train`` data (its photographs and ``train``
    scenes), a random BERT of the config's architecture on the data's words, warm-up 2 steps, one epoch."""
    from tests import tiny_vcr
    from vcr.task import TASK

    data = os.path.join(root, "demo")
    made = subprocess.run([sys.executable, os.path.join(ROOT, "demo", "make_demo_data.py"), "--out", data,
                           "--train", str(train), "--val", "1", "--test", "1"], capture_output=True, text=True)
    if made.returncode:
        raise RuntimeError("make_demo_data.py failed: " + made.stderr[-2000:])
    vl = TASK.load_config(DEMO_CFG).NETWORK.VLBERT
    words = tiny_vcr._vocabulary(data)[len(tiny_vcr.SPECIAL_TOKENS):]
    # words from id 1000 on, as in BERT's vocabulary: the config's word_embedding_frozen trains ids < 1000 only
    vocab = tiny_vcr.SPECIAL_TOKENS + ["[unused{}]".format(i) for i in range(1000 - len(tiny_vcr.SPECIAL_TOKENS))]
    vocab += words
    arch = {k: vl[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                               "max_position_embeddings", "hidden_dropout_prob", "attention_probs_dropout_prob")}
    tiny_vcr._bert_folder(os.path.join(root, "demo_bert"), vocab, **arch)
    opts = ["DATASET.DATASET_PATH", data, "NETWORK.BERT_MODEL_NAME", os.path.join(root, "demo_bert"),
            "NETWORK.VLBERT.vocab_size", str(len(vocab)), "TRAIN.END_EPOCH", "1", "TRAIN.WARMUP_STEPS", "2",
            "LOG_FREQUENT", "1", "NUM_WORKERS_PER_GPU", "0"]
    return {"entry": entry("vcr"), "cfg": DEMO_CFG, "opts": opts}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("root", help="folder to write the inputs and runs.json into")
    parser.add_argument("--demo-train", type=int, default=21,
                        help="learnable training scenes of the agreement run's data (with the 11 photographs)")
    args = parser.parse_args()
    import warnings
    warnings.simplefilter("ignore")  # random-init warnings of the model builders
    runs = task_runs(args.root)
    runs["agree"] = agreement_run(args.root, args.demo_train)
    with open(os.path.join(args.root, "runs.json"), "w") as f:
        json.dump(runs, f, indent=1)


if __name__ == "__main__":
    main()
