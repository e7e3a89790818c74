"""Would token-length bucketing pay? Our training step on VCR Q->A batches formed in random order vs batches
of similar text length, in one process, optimizer steps alternating.

Token-length bucketing puts samples of similar length in one batch so that less padding is computed. Our
encoder already runs its dense layers on the real tokens only (padding costs only attention and
embeddings), so the gain is expected to be small; this bench measures it before a sampler is built for it.

Both arms run the real engine step (``bench/throughput.py``'s ``Path``: model, optimizer, precision and
``Trainer`` of the engine) on the same synthetic items (VCR Q->A sizes, ``throughput.synthetic_items``):

* random: the items in their drawn order, ``TRAIN.BATCH_IMAGES`` per batch;
* grouped: the same items sorted by their longest question + answer sequence, then batched (the best case
  of a bucketing sampler: one bucket per batch).

Prints the padded share of the encoder's tokens and samples/s of each arm, and grouped / random.

    python bench/length_grouping.py --steps 6 --opts SCALES "[128,192]" TRAIN.BATCH_IMAGES 4 \
        NETWORK.IMAGE_NUM_LAYERS 18 NETWORK.IMAGE_ROI_POOLED_SIZE 4 NETWORK.IMAGE_C5_DILATED false DATASET.MASK_SIZE 2
"""
import argparse
import itertools
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import throughput  # noqa: E402  (the bench next to this one)

ITEMS = 64  # items per arm, cycled; the grouped arm sorts these


def text_length(item):
    """Tokens of the longest [CLS] question [SEP] answer [SEP] sequence of a synthetic Q->A item."""
    question, answers = item[3], item[5]
    return len(question) + max(len(a) for a in answers) + 3


def batches(items, batch_size):
    from common.data.collate import BatchCollator
    collate = BatchCollator(["image", "boxes", "masks", "question", "question_align_matrix", "answer_choices",
                             "answer_align_matrix", "answer_label", "im_info"])
    return [collate(items[i:i + batch_size]) for i in range(0, len(items) - batch_size + 1, batch_size)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cfg", default=throughput.DEFAULT_CFG, help="VCR Q->A config (default %(default)s)")
    parser.add_argument("--precision", default="fp32", choices=sorted(throughput.PRECISIONS))
    parser.add_argument("--steps", type=int, default=6, help="timed optimizer steps per arm")
    parser.add_argument("--warmup", type=int, default=1, help="untimed optimizer steps per arm first")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--opts", nargs=argparse.REMAINDER, default=[], help="config overrides KEY VALUE ...")
    args = parser.parse_args()
    args.device, args.workers, args.accumulate_run, args.synthetic = "cpu", 0, 0, True
    warnings.simplefilter("ignore")
    torch.set_num_threads(args.threads)

    task, cfg = throughput.load_cfg(args)
    b = int(cfg.TRAIN.BATCH_IMAGES)
    items = throughput.synthetic_items(cfg, ITEMS)
    arms = {"random": batches(items, b), "grouped": batches(sorted(items, key=text_length), b)}
    paths = {}
    for name, arm in arms.items():
        path = throughput.Path("ours", task, cfg, args, torch.device("cpu"))
        path.batches = itertools.cycle(arm)  # same weights (Path seeds them), other batches
        path.train(args.warmup, timed=False)
        path.recorder.__init__()
        paths[name] = path
    for step in range(args.steps):
        for name in (list(paths) if step % 2 == 0 else list(paths)[::-1]):
            paths[name].train(1, timed=True)

    print("{} | {} | {} | batch {} x k={} | {} timed optimizer steps per arm, alternating".format(
        args.cfg, " ".join(args.opts) or "no --opts", args.precision, b, paths["random"].k, args.steps))
    for name, path in paths.items():
        rec = path.recorder
        padded = 1 - sum(rec.lens) / rec.padded  # rec.padded counts every position of the padded batches
        print("{:<8} padded share of encoder tokens {:5.1%}   {:.3f} samples/s".format(
            name, padded, rec.samples / path.wall))
    print("grouped / random: {:.3f}x samples/s".format(paths["random"].wall / paths["grouped"].wall))


if __name__ == "__main__":
    main()
