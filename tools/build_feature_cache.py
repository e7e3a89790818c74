"""Convert precomputed region features into a memory-mapped cache (see common/data/feature_cache.py).

    python tools/build_feature_cache.py SOURCE [SOURCE ...] --out CACHE [--dtype float16]

A SOURCE is a folder of per-image JSON files (``<image_id>.json``, also ``archive.zip@/folder``)
or a bottom-up-attention ``.tsv`` file. All sources go into one cache, in the order given.
"""
import argparse
import itertools
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.cli import run_main  # noqa: E402
from common.data.feature_cache import DTYPES, write_feature_cache  # noqa: E402
from common.data.region_features import iter_feature_folder, iter_tsv  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser("Build a memory-mapped region feature cache")
    parser.add_argument("sources", nargs="+", help="folders of <image_id>.json files and/or .tsv files")
    parser.add_argument("--out", required=True, help="cache folder to create")
    parser.add_argument("--dtype", choices=DTYPES, default="float32",
                        help="feature precision: float32 (exact) or float16 (half the disk and page cache)")
    parser.add_argument("--feature-dim", type=int, help="expected feature width D (2048 for the released "
                                                        "features); checked on every image")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing cache")
    return parser.parse_args(argv)


def regions_of(source, feature_dim):
    """RegionFeatures of one source: a .tsv file or a folder of JSON files."""
    if source.endswith(".tsv"):
        return iter_tsv(source, feature_dim)
    return iter_feature_folder(source, feature_dim)


def main(argv=None):
    args = parse_args(argv)
    start = time.time()
    items = itertools.chain.from_iterable(regions_of(s, args.feature_dim) for s in args.sources)
    stats = write_feature_cache(items, args.out, dtype=args.dtype, overwrite=args.overwrite)
    print("{}: {images} images, {boxes} boxes of {feature_dim} features ({dtype}), {mib:.1f} MiB in {sec:.1f} s"
          .format(args.out, dtype=args.dtype, mib=stats["bytes"] / 2 ** 20, sec=time.time() - start, **stats))


if __name__ == "__main__":
    run_main(main)
