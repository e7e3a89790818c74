"""An example input for the own-images walkthrough (demo/run_demo_own_images.sh): the 11
scikit-image photographs of the demo as a folder of photos, and their hand-written questions
(``demo/make_demo_data.py``, object references spelt out as in ``demo/make_vqa_demo_data.py``) as the
QA JSON that ``tools/own_vqa_data.py`` reads; question k of a photograph goes to train, val or test
(k mod 3), the right answer without its final period.

    python demo/own_images_example.py --out data/own_example [--max-side 640]

Writes ``<out>/photos/<name>.jpg`` and ``<out>/qa.json``.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from make_demo_data import REAL, real_image  # noqa: E402
from make_vqa_demo_data import spell_out  # noqa: E402

SPLITS = ("train", "val", "test")


def make_example(out, max_side=None):
    """Write the photos and ``qa.json`` under ``out`` (photos shrunk to ``max_side`` pixels when given);
    returns the number of questions."""
    os.makedirs(os.path.join(out, "photos"), exist_ok=True)
    qa = []
    for name, (loader, objects, _, items) in REAL.items():
        image = real_image(loader)
        if max_side:
            image.thumbnail((max_side, max_side))
        image.save(os.path.join(out, "photos", name + ".jpg"), quality=92)
        for k, (question, answers, _) in enumerate(items):
            qa.append({"image": name + ".jpg", "question": spell_out(question, objects),
                       "answer": spell_out(answers[0], objects).rstrip(" ."), "split": SPLITS[k % len(SPLITS)]})
    with open(os.path.join(out, "qa.json"), "w") as f:
        json.dump(qa, f, indent=1)
    return len(qa)


def main(argv=None):
    parser = argparse.ArgumentParser("Photos and a QA JSON for the own-images walkthrough")
    parser.add_argument("--out", default=os.path.join("data", "own_example"), help="folder to write")
    parser.add_argument("--max-side", type=int, help="shrink the photos to at most this many pixels a side")
    args = parser.parse_args(argv)
    print("{}: photos/ and qa.json ({} questions)".format(args.out, make_example(args.out, args.max_side)))


if __name__ == "__main__":
    main()
