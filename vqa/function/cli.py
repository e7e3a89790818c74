"""The command line of ``vqa/val.py`` and ``vqa/test.py`` (one parser: they differ in the split's key,
its default and whether the JSON is written by default)."""
import argparse
import os

from common.runtime import distributed as cdist

# mode -> (description, batch-size key, split key, default split, default result folder)
MODES = {
    "val": ("VQA v2 accuracy on a split with annotations (official metric)", "VAL", "VAL_IMAGE_SET", None, None),
    "test": ("VQA v2 test-set result file (EvalAI format)", "TEST", "TEST_IMAGE_SET", "test2015", "./test_result"),
}


def parse_args(mode, argv=None):
    """Arguments of ``vqa/<mode>.py`` (mode 'val' or 'test'), ``argv`` None: ``sys.argv``."""
    description, section, split_key, split, result_path = MODES[mode]
    parser = argparse.ArgumentParser(description)
    parser.add_argument("--cfg", required=True, help="config of the model")
    parser.add_argument("--ckpt", required=True, help="checkpoint of the model")
    parser.add_argument("--split", default=split, help="DATASET.{} instead of the config's".format(split_key))
    parser.add_argument("--bs", type=int, help="{}.BATCH_IMAGES (questions per batch and rank)".format(section))
    if mode == "test":
        parser.add_argument("--gpus", type=int, nargs="+", help="accepted for compatibility; one device per rank")
    parser.add_argument("--model-dir", help="accepted for the launch scripts; unused")
    parser.add_argument("--result-path", default=result_path, help="folder of the JSON file" +
                        (" (none: not written)" if result_path is None else ""))
    parser.add_argument("--result-name", help="file name prefix (default: the config's file name)")
    parser.add_argument("--opts", nargs=argparse.REMAINDER, default=[], help="config overrides KEY VALUE ...")
    cdist.add_launcher_args(parser)
    return parser.parse_args(argv)


def config_opts(mode, args):
    """``--opts`` of ``args`` plus the split and the batch size they set."""
    _, section, split_key, _, _ = MODES[mode]
    opts = list(args.opts)
    if args.split:
        opts += ["DATASET." + split_key, args.split]
    if args.bs is not None:
        opts += [section + ".BATCH_IMAGES", str(args.bs)]
    return opts


def result_name(args):
    """``--result-name``, else the config's file name without its extension."""
    return args.result_name or os.path.splitext(os.path.basename(args.cfg))[0]
