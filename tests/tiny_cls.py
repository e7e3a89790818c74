"""Tiny cls runs through the real entry point, ``cls/train_end2end.py``, for the tests (and bench/gpu_suite.py).

A ViT of one block of width 24 on 32 px images (:data:`TINY_VIT`), trained on ``demo/make_cls_demo_data.py``'s
CIFAR-10-format data for one epoch (:func:`opts`).
"""
TINY_VIT = ["NETWORK.ARCH", "vit_tiny_patch16_224", "NETWORK.ARCH_KWARGS",
            "[['img_size', 32], ['patch_size', 8], ['embed_dim', 24], ['depth', 1], ['num_heads', 2]]",
            "DATASET.IMAGE_SIZE", "32"]


def opts(data, cfg_name):
    """``--opts`` of a one-epoch tiny run of the shipped config ``cfgs/cls/<cfg_name>.yaml`` on the demo data folder
    ``data``: the config's own batch layout at 8 images per step, 2 x 4 (the GPU recipes) or 8 x 1 (the demo)."""
    batch = ["TRAIN.BATCH_IMAGES", "2"] if "1x24G" in cfg_name else ["TRAIN.BATCH_IMAGES", "8"]
    return TINY_VIT + batch + [
        "DATASET.DATASET", "cifar10", "DATASET.DATASET_PATH", data, "NETWORK.NUM_CLASSES", "10",
        "NUM_WORKERS_PER_GPU", "0", "TRAIN.END_EPOCH", "1", "VAL.BATCH_IMAGES", "5", "TEST.BATCH_IMAGES", "5",
        "TRAIN.WARMUP_STEPS", "1"]
