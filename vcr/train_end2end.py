"""Train (fine-tune) VL-BERT on VCR: ``python vcr/train_end2end.py --cfg CFG --model-dir DIR [--dist] ...``."""
import _init_paths  # noqa: F401
import os

from common.cli import config_from_args, run_main, train_argument_parser, train_output_folder
from vcr.function.config import load_config
from vcr.function.test import test_net
from vcr.function.train import train_net


def main():
    args = train_argument_parser("Train VL-BERT on VCR").parse_args()
    cfg = config_from_args(args, load_config)
    rank, _ = train_net(args, cfg)
    if args.do_test and rank == 0:
        folder = train_output_folder(cfg, args.cfg)
        ckpt = os.path.join(folder, "{}-best.model".format(cfg.MODEL_PREFIX))
        test_net(cfg, ckpt, save_path=os.path.join(folder, "test_result"), save_name=cfg.MODEL_PREFIX)


if __name__ == "__main__":
    run_main(main)
