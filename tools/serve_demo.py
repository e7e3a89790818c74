"""A web page on a trained model: upload a photo (or pick a demo photograph), type a question, see the top
answers, the boxes and the attention of the question's words over the regions.

    python tools/serve_demo.py --cfg CFG --ckpt CKPT [--host 127.0.0.1] [--port 7860] [--examples FILE]
        [--task T] [--feature-weights F] [--box-source grid|detector|file --grid 4x4 --detector-weights F
        --box-file F] [--device cpu] [--topk 5] [--opts KEY VALUE ...]

The text is a question (VQA), a caption with ``[MASK]`` words (pretraining) or a referring expression
(RefCOCO+); a cls checkpoint takes the photo alone and shows its top-5 classes. The predictor is
``common.inference.Predictor`` with the flags of ``tools/predict.py``; the page is ``common/inference/web_demo.py``.
``--examples`` is a JSON list of ``{"image": FILE, "question": TEXT}`` (or ``"caption"`` / ``"expression"``),
images relative to the file (``tools/predict.py --questions``'s format); default: four of the demo
photographs and two shape scenes with a question each (``demo/make_demo_data.py``).

The page runs offline and stays on this machine: gradio's analytics off, no share link, the system's fonts (no
font CDN), bound to 127.0.0.1 unless ``--host`` says otherwise, uploads kept in a private temporary folder
removed at exit, each upload deleted once answered. One model call at a time (a queue); a bad photo or an
empty question shows a message in the page. It prints ``serving on http://HOST:PORT`` once the page answers;
Ctrl-C stops it.
"""
import argparse
import atexit
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "demo"))  # the default example photographs are the demo's scenes

from common.cli import run_main  # noqa: E402
from common.errors import UserInputError  # noqa: E402

# Demo photographs offered by default: scikit-image photographs of the demo data set (each with its first
# question) and shape scenes of the VQA demo (a colour question and a count question).
DEMO_PHOTOS = ("chelsea", "coffee", "astronaut", "camera")
DEMO_SCENES = 2


def parse_args(argv=None):
    from predict import add_model_arguments  # tools/predict.py

    parser = argparse.ArgumentParser("A web page on a trained model (gradio)")
    parser.add_argument("--cfg", required=True, help="the config the checkpoint was trained with")
    parser.add_argument("--ckpt", required=True, help="checkpoint file")
    parser.add_argument("--task", help="task name (default: the task of the config's DATASET.DATASET)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=7860, help="port (default 7860)")
    parser.add_argument("--examples", help="JSON list of {\"image\", \"question\"|\"caption\"|\"expression\"} "
                        "offered under the inputs (default: demo photographs)")
    add_model_arguments(parser)
    parser.add_argument("--topk", type=int, default=5, help="answers shown (default 5)")
    parser.add_argument("--opts", nargs=argparse.REMAINDER, default=[], help="config overrides KEY VALUE ...")
    return parser.parse_args(argv)


def demo_examples(folder, text_field):
    """Write the default demo photographs under ``folder``; returns their ``(path, text)`` pairs (the text is
    the photograph's question for a question-taking model, else empty)."""
    import numpy as np
    from make_demo_data import REAL, make_scene, real_image
    from make_vqa_demo_data import shapes_question, spell_out

    examples = []
    rng = np.random.RandomState(0)
    for k in range(DEMO_SCENES):
        image, objects = make_scene(rng)
        path = os.path.join(folder, "scene{}.png".format(k))
        image.save(path)
        question = shapes_question(objects, ("leftmost", "count")[k % 2], rng)[0]
        examples.append((path, question))
    for name in DEMO_PHOTOS:
        loader, objects, _, items = REAL[name]
        path = os.path.join(folder, name + ".jpg")
        real_image(loader).save(path, quality=92)
        examples.append((path, spell_out(items[0][0], objects)))
    return [(p, t if text_field == "question" else "") for p, t in examples]


def read_examples(path, text_field):
    """``(image path, text)`` pairs of an ``--examples`` file.

    Raises:
        UserInputError: not a JSON list of objects with an ``image`` file that exists (names the entry).
    """
    from common.data.loading import load_json

    entries = load_json(path)
    if not isinstance(entries, list):
        raise UserInputError("--examples {}: expected a JSON list of {{\"image\", \"{}\"}}".format(
            path, text_field or "image"))
    out = []
    for k, entry in enumerate(entries):
        image = entry.get("image") if isinstance(entry, dict) else None
        if not isinstance(image, str):
            raise UserInputError("--examples {} entry {}: expected an object with an 'image' file".format(path, k))
        image = os.path.join(os.path.dirname(os.path.abspath(path)), image)
        if not os.path.isfile(image):
            raise UserInputError("--examples {} entry {}: image '{}' does not exist".format(path, k, image))
        out.append((image, str(entry.get(text_field, "")) if text_field else ""))
    return out


def check_port(host, port):
    """UserInputError when ``host:port`` cannot be bound (in use, or not an address of this machine), before the
    model is loaded."""
    import socket

    try:
        with socket.create_server((host, port)):
            pass
    except OSError as e:
        raise UserInputError("cannot serve on {}:{}: {}; give another --port (or --host)".format(
            host, port, os.strerror(e.errno) if e.errno else e)) from None


def main(argv=None):
    args = parse_args(argv)
    check_port(args.host, args.port)
    # Before gradio is imported: no usage statistics or version check, uploads in a folder of ours.
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
    os.environ["HF_HUB_OFFLINE"] = "1"
    private = tempfile.mkdtemp(prefix="serve_demo-")
    atexit.register(shutil.rmtree, private, ignore_errors=True)
    os.environ["GRADIO_TEMP_DIR"] = os.path.join(private, "uploads")
    try:
        import gradio  # noqa: F401
    except ImportError:
        raise UserInputError("gradio is not installed: run scripts/setup_env.sh --demo (requirements-demo.txt)") \
            from None
    from common.inference import Predictor
    from common.inference.web_demo import DemoBackend, build_page, launch
    from predict import box_source  # tools/predict.py (its import registers every task)

    predictor = Predictor.from_checkpoint(args.cfg, args.ckpt, device=args.device, opts=args.opts,
                                          feature_weights=args.feature_weights, box_source=box_source(args),
                                          task=args.task)
    backend = DemoBackend(predictor, topk=args.topk)
    if args.examples:
        examples = read_examples(args.examples, backend.text_field)
    else:
        os.makedirs(os.path.join(private, "examples"))
        examples = demo_examples(os.path.join(private, "examples"), backend.text_field)
    title = "{}: {}".format(predictor.task.model_title(predictor.cfg), os.path.basename(args.ckpt))
    page = build_page(backend, examples, title=title)
    url = launch(page, args.host, args.port, allowed_paths=[os.path.join(private, "examples")])
    print("serving on {}".format(url), flush=True)
    page.block_thread()


if __name__ == "__main__":
    run_main(main)
