"""Write the cls demo's image set: 10 classes of 32x32 RGB pictures in CIFAR-10's "python version" layout
(deterministic: the same bytes for the same arguments).

The classes are patterns only their pixels tell apart, and that the recipe's augmentation (flips,
TrivialAugmentWide's rotations, shears and colour changes, crops of 80-100% of the area) leaves in
their class: classes 0-4 are k-fold pinwheels (``sin(k * angle)`` around a random centre, k = 2..6),
classes 5-9 are concentric rings of period 2.5, 3.75, 5.6, 8.4 or 12.7 pixels. Each picture draws its
centre, phase, two colours (a contrast of at least 80 grey levels) and Gaussian noise (sigma 12), so
neither the mean colour nor a single pixel gives the class: chance is 10%.

Output (``--out``, default data/demo_cls; ``DATASET.DATASET: cifar10``):
    data_batch_1..5  ``{b'data': uint8 [N, 3072] (R, G, B planes), b'labels': [N ints], b'batch_label': ...}``,
                   a fifth of the training pictures each
    test_batch     the same for the validation / test pictures
    batches.meta   ``{b'label_names': [10 bytes], b'num_cases_per_batch': N, b'num_vis': 3072}``
Pickled with protocol 2, as the official files (numpy arrays through ``ndarray.__reduce__``).

Usage: python demo/make_cls_demo_data.py [--out data/demo_cls] [--seed 0] [--train 5000] [--test 1000]
(``--train`` a multiple of 5)
"""
import argparse
import os
import pickle

import numpy as np

SIZE = 32
NAMES = ["pinwheel{}".format(k) for k in range(2, 7)] + ["rings{}".format(i) for i in range(5)]
RING_PERIODS = 2.5 * 1.5 ** np.arange(5)


def picture(label, rng):
    """One uint8 ``[3, 32, 32]`` picture of class ``label`` drawn from the numpy Generator ``rng``."""
    cy, cx = rng.uniform(10, 22, size=2)
    y, x = np.mgrid[0:SIZE, 0:SIZE].astype(np.float64)
    phase = rng.uniform(0, 2 * np.pi)
    if label < 5:
        wave = np.sin((label + 2) * np.arctan2(y - cy, x - cx) + phase)
    else:
        wave = np.sin(2 * np.pi * np.hypot(y - cy, x - cx) / RING_PERIODS[label - 5] + phase)
    while True:  # two colours far enough apart that the pattern shows
        a, b = rng.uniform(0, 255, size=(2, 3))
        if abs(a.mean() - b.mean()) >= 80:
            break
    mix = (0.5 + 0.5 * wave)[None]
    image = a[:, None, None] * (1 - mix) + b[:, None, None] * mix + rng.normal(0, 12, size=(3, SIZE, SIZE))
    return np.clip(np.round(image), 0, 255).astype(np.uint8)


def make_split(n, rng):
    """``(data uint8 [n, 3072], labels list)``: ``n`` pictures, classes in turn (balanced)."""
    labels = [i % len(NAMES) for i in range(n)]
    data = np.stack([picture(label, rng).reshape(-1) for label in labels])
    return data, labels


def write(out, seed=0, train=5000, test=1000):
    """Write the three files under ``out`` (see the module docstring); returns ``out``."""
    os.makedirs(out, exist_ok=True)
    rng = np.random.Generator(np.random.PCG64(seed))
    files = [("data_batch_{}".format(i), train // 5) for i in range(1, 6)] + [("test_batch", test)]
    for name, n in files:
        data, labels = make_split(n, rng)
        with open(os.path.join(out, name), "wb") as f:
            pickle.dump({b"batch_label": name.encode(), b"labels": labels, b"data": data}, f, protocol=2)
    with open(os.path.join(out, "batches.meta"), "wb") as f:
        pickle.dump({b"label_names": [n.encode() for n in NAMES], b"num_cases_per_batch": train // 5,
                     b"num_vis": 3 * SIZE * SIZE}, f, protocol=2)
    return out


def main():
    parser = argparse.ArgumentParser("write the cls demo image set (CIFAR-10 python layout)")
    parser.add_argument("--out", default="data/demo_cls")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train", type=int, default=5000, help="training pictures")
    parser.add_argument("--test", type=int, default=1000, help="validation / test pictures")
    args = parser.parse_args()
    print(write(args.out, args.seed, args.train, args.test))


if __name__ == "__main__":
    main()
