"""The web page (``tools/serve_demo.py`` on ``common/inference/web_demo.py``) on tiny trained checkpoints: its backend
shows what the predictor computes (answers, boxes, the attention painted per word), bad photos and questions give a
message, not an exception; and in a real browser (Debian's Chromium through selenium) the page answers a photo
and a question as the predictor does, shows the error of a file that is not an image and answers again.

The checkpoints are those of ``tests/test_predict.py`` (a tiny VQA model on precomputed features of a random
ResNet-50, a tiny ViT classifier).
"""
import contextlib
import html
import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np
import pytest
from matplotlib import colormaps
from PIL import Image

from common.data.loading import load_image
from common.errors import UserInputError
from common.inference import Predictor
from common.inference.drawing import BOX_COLOUR, CHOSEN_COLOUR, PAINT_ALPHA, thumbnail
from common.inference.web_demo import DRAWN_SIDE, MAX_PIXELS, DemoBackend, build_page, launch
from tests.conftest import ROOT, load_task
from tests.golden import assert_ranking_close, close
from tests.test_predict import LONG_TEXT, VQA_CFG, bad_photos, cls_run, refcoco_run, vqa_run  # noqa: F401

SERVE = os.path.join(ROOT, "tools", "serve_demo.py")
GRID = ["--box-source", "grid", "--grid", "2x2"]  # 4 cells, the whole image first: 5 regions
QUESTION = "what color is it ?"
# The VQA model's text: [CLS] question [SEP] [MASK] [SEP].
TOKENS = ["[CLS]", "what", "color", "is", "it", "?", "[SEP]", "[MASK]", "[SEP]"]


def _photo(vqa_run):
    return os.path.join(vqa_run["inputs"].coco, "test2015", "COCO_test2015_000000000004.jpg")


@pytest.fixture(scope="module")
def vqa_backend(vqa_run):
    predictor = Predictor.from_checkpoint(VQA_CFG, vqa_run["ckpt"], opts=vqa_run["opts"],
                                          feature_weights=vqa_run["weights"],
                                          box_source={"kind": "grid", "grid": "2x2"})
    return DemoBackend(predictor, topk=3)


GRID_SOURCE = {"kind": "grid", "grid": "2x2"}
CAPTION = "a [MASK] sits on the [MASK]"


@pytest.fixture(scope="module")
def refcoco_backend(refcoco_run):
    predictor = Predictor.from_checkpoint(refcoco_run["cfg"], refcoco_run["ckpt"], opts=refcoco_run["opts"],
                                          box_source=GRID_SOURCE)
    return DemoBackend(predictor, topk=3)


@pytest.fixture(scope="module")
def pretrain_backend(tiny_pretrain, tmp_path_factory):
    """The demo pretraining config at tiny size with seeded-random weights."""
    from pretrain.task import TASK
    from tests import tiny_pretrain as tp
    from tests.test_eval_outputs import _checkpoint

    name = "demo_e2e_cpu.yaml"
    opts = tp.opts(name, tiny_pretrain)
    ckpt = _checkpoint(TASK, TASK.load_config(tp.cfg_path(name), opts),
                       tmp_path_factory.mktemp("web_pretrain") / "pretrain-0000.model")
    return DemoBackend(Predictor.from_checkpoint(tp.cfg_path(name), ckpt, opts=opts, box_source=GRID_SOURCE), topk=3)


@pytest.fixture(scope="module")
def cls_backend(cls_run):
    return DemoBackend(Predictor.from_checkpoint(cls_run["cfg"], cls_run["ckpt"], opts=cls_run["opts"]))


def _same_predictions(shown, expected):
    """The page's ranking (the predictor's call with the attention recorded: another computation) and the plain
    call's: tie-aware, scores within the tolerance of tests/golden.py."""
    assert_ranking_close([((p["label"], p["index"]), p["score"]) for p in shown],
                         [((p["label"], p["index"]), p["score"]) for p in expected], "shown")


def _pairs(predictions):
    return [(p["label"], p["score"]) for p in predictions]


def _tied_best(predictions):
    """The labels whose score ties the best one's (tests/golden.py's tolerance): what another computation may
    show first."""
    return {p["label"] for p in predictions if close(p["score"], predictions[0]["score"])}


def _assert_table_shows(rows, predictions):
    """The page's table rows ``[rank, label, score to 4 decimals]``: the ranking of ``predictions``, tie-aware,
    each score within the rounding (5e-5) and the tolerance of the predictor's score for that label."""
    scores = dict(_pairs(predictions))
    assert [r[0] for r in rows] == [str(k) for k in range(1, len(predictions) + 1)]
    assert_ranking_close([(label, scores.get(label, predictions[-1]["score"])) for _, label, _ in rows],
                         _pairs(predictions), "table")
    for _, label, shown in rows:
        assert shown == "{:.4f}".format(float(shown)) and abs(float(shown) - scores.get(label, 0.0)) <= 5e-5 + 1e-6


def test_backend_shows_the_predictors_answers_boxes_and_attention(vqa_run, vqa_backend):
    photo = _photo(vqa_run)
    result = vqa_backend(photo, "  " + QUESTION + " ")
    assert result.message == ""
    expected, = vqa_backend.predictor({"image": photo, "question": QUESTION}, topk=3)
    # The answers: the predictor's (its call with the attention recorded on the side), in the page's label too.
    _same_predictions(result.prediction["predictions"], expected["predictions"])
    assert result.prediction["boxes"] == expected["boxes"] and result.prediction["question"] == QUESTION
    assert result.prediction["image"] == os.path.basename(photo)
    assert_ranking_close(list(result.scores.items()), _pairs(expected["predictions"]), "the label's scores")

    # The boxes drawn on the photo enlarged to DRAWN_SIDE (40 x 30 -> 512 x 384), each box's outline in yellow.
    boxes = np.array(expected["boxes"])
    assert len(boxes) == 5 and result.boxes_image.size == (512, 384)
    scale = DRAWN_SIDE / 40
    for x1, _, x2, y2 in boxes * scale:
        assert result.boxes_image.getpixel((int((x1 + x2) / 2), int(round(y2)))) == BOX_COLOUR

    # The attention: every layer's and head's probabilities over the tokens of the VL-BERT's sequence (text,
    # the 5 regions, [END]); each row sums to 1.
    att = result.attention
    assert att["tokens"] == TOKENS + ["[REGION {}]".format(k) for k in range(5)] + ["[END]"]
    assert att["text"] == (0, 9) and att["regions"] == (9, 14)
    probs = att["probs"]
    assert probs.shape == (2, 2, 15, 15)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)

    # A tile per word ([CLS] and [SEP] left out): the photo with each region painted by the word's attention to
    # it, mean over layers and heads, on one colour scale for all words; in the bottom-right cell only region 4
    # (the smallest box there, painted last) shows.
    tiles = DemoBackend.attention_tiles(att)
    assert [caption.split()[0] for _, caption in tiles] == ["what", "color", "is", "it", "?", "[MASK]"]
    mean = probs.mean(axis=(0, 1))
    words = [1, 2, 3, 4, 5, 7]
    vmax = mean[words, 9:14].max()
    thumb, scaled = thumbnail(load_image(photo), boxes, DRAWN_SIDE, enlarge=True)
    x, y = int(scaled[4, 0] + 40), int(scaled[4, 1] + 40)
    for (tile, caption), q in zip(tiles, words):
        colour = np.array(colormaps["inferno"](mean[q, 13] / vmax)[:3]) * 255
        want = (1 - PAINT_ALPHA) * np.array(thumb.getpixel((x, y))) + PAINT_ALPHA * colour
        assert np.abs(np.array(tile.getpixel((x, y))) - want).max() <= 1
        assert caption == "{} {:.3f}".format(TOKENS[q], mean[q, 9:14].max())
    # The layer slider: one layer's heads averaged; no layer 3 in a 2-layer model.
    second = DemoBackend.attention_tiles(att, layer=2)
    colour = np.array(colormaps["inferno"](probs[1].mean(0)[7, 13] / probs[1].mean(0)[words, 9:14].max())[:3]) * 255
    want = (1 - PAINT_ALPHA) * np.array(thumb.getpixel((x, y))) + PAINT_ALPHA * colour
    assert np.abs(np.array(second[-1][0].getpixel((x, y))) - want).max() <= 1
    with pytest.raises(UserInputError, match="layer 3 does not exist: 0 .mean. to 2"):
        DemoBackend.attention_tiles(att, layer=3)


def test_bad_photos_and_questions_give_a_message_and_the_backend_answers_on(vqa_run, vqa_backend, tmp_path):
    photo = _photo(vqa_run)
    (tmp_path / "notes.jpg").write_text("not an image")
    data = open(photo, "rb").read()
    (tmp_path / "cut.jpg").write_bytes(data[:len(data) // 2])
    side = int(MAX_PIXELS ** 0.5) + 1  # 4473 x 4473: just over 20 Mpixels (an all-black PNG of 20 kB)
    Image.new("L", (side, side)).save(tmp_path / "huge.png")
    cases = [(None, QUESTION, "no photo: upload one or pick a demo photograph"),
             (str(tmp_path / "notes.jpg"), QUESTION, "'notes.jpg' is not an image file"),
             (str(tmp_path / "cut.jpg"), QUESTION, "cannot decode image 'cut.jpg': image file is truncated"),
             (str(tmp_path / "huge.png"), QUESTION, "'huge.png' is 4473 x 4473 = 20,007,729 pixels, over the limit "
                                                     "of 20,000,000 (20 Mpixels)"),
             (photo, "   ", "'question' must be non-empty text")]
    for path, text, message in cases:
        result = vqa_backend(path, text)
        assert message in result.message and result.prediction is None and result.attention is None
    # The uploaded file's own name, not gradio's temporary path, in the message.
    assert "'upload.jpg' is not" in vqa_backend(str(tmp_path / "notes.jpg"), QUESTION, name="upload.jpg").message
    expected, = vqa_backend.predictor({"image": photo, "question": QUESTION}, topk=3)
    _same_predictions(vqa_backend(photo, QUESTION).prediction["predictions"], expected["predictions"])


def test_a_cls_checkpoint_shows_its_top5_classes(cls_run, cls_backend):
    from cls.data.datasets import CIFAR10

    backend = cls_backend
    predictor = backend.predictor
    assert backend.text_field is None and backend.num_layers == 0
    image = CIFAR10(cls_run["data"], "test", None).images[0]
    path = os.path.join(str(cls_run["ckpt"]) + ".photo.png")
    Image.fromarray(image).save(path)
    result = backend(path, "ignored")
    expected, = predictor({"image": path})
    _same_predictions(result.prediction["predictions"], expected["predictions"])
    assert len(result.scores) == 5 and set(result.scores) <= set(cls_run["names"])
    assert result.boxes_image is None and result.attention is None


# ---------------------------------------------------------------------------------------------- real browser
def _chromium():
    """A headless Chromium driven by selenium (Debian's chromium + chromium-driver); skips, saying why, where
    they are not installed (.ci/run installs them)."""
    missing = [name for name in ("chromium", "chromedriver") if shutil.which(name) is None]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        import gradio  # noqa: F401
    except ImportError as e:
        missing.append("python package {} (requirements-test.txt)".format(e.name))
    if missing:
        pytest.skip("browser test: {} not installed (apt-get install chromium chromium-driver; scripts/setup_env.sh "
                    "--test)".format(", ".join(missing)))
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1300,2100"):
        options.add_argument(arg)
    options.binary_location = shutil.which("chromium")
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})  # every request the page makes
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


@pytest.fixture(scope="module")
def chromium():
    """The module's browser (:func:`_chromium`; asked for before the tiny runs, so a skip costs nothing)."""
    driver = _chromium()
    yield driver
    driver.quit()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(vqa_run, port, examples):
    """Start ``tools/serve_demo.py`` on the tiny VQA run; returns (process, queue of its output lines)."""
    proc = subprocess.Popen([sys.executable, SERVE, "--cfg", VQA_CFG, "--ckpt", vqa_run["ckpt"], "--port", str(port),
                             "--feature-weights", vqa_run["weights"], "--topk", "3", "--examples", examples]
                            + GRID + ["--opts"]
                            + vqa_run["opts"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    return proc, lines


def _wait_serving(proc, lines, port, timeout=180):
    """Wait for the server's ``serving on http://127.0.0.1:PORT`` line (fails with its output otherwise)."""
    seen, deadline = [], time.time() + timeout
    while time.time() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        seen.append(line)
        if line.startswith("serving on "):
            assert line.strip() == "serving on http://127.0.0.1:{}".format(port)
            return
    proc.kill()
    pytest.fail("serve_demo.py did not print 'serving on' (exit {}):\n{}".format(proc.poll(), "".join(seen)))


def _ask(driver, photo, text):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    for clear in driver.find_elements(By.CSS_SELECTOR, "#photo button[aria-label='Clear']"):
        clear.click()
    WebDriverWait(driver, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#photo input[type=file]"))
    driver.find_element(By.CSS_SELECTOR, "#photo input[type=file]").send_keys(photo)
    box = driver.find_element(By.CSS_SELECTOR, "#text textarea")
    box.clear()
    box.send_keys(text)
    # The upload is done when the preview shows.
    WebDriverWait(driver, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#photo img"))
    before = driver.find_element(By.ID, "message").text, driver.find_element(By.ID, "table").text
    driver.find_element(By.ID, "ask").click()
    WebDriverWait(driver, 60).until(
        lambda d: (d.find_element(By.ID, "message").text, d.find_element(By.ID, "table").text) != before
        and not d.find_elements(By.CSS_SELECTOR, "#table .pending, #answers .pending"))
    return driver.find_element(By.ID, "message").text, driver.find_element(By.ID, "table").text


def test_the_page_in_a_real_browser_answers_as_the_predictor(chromium, vqa_run, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    driver = chromium
    port = _free_port()
    (tmp_path / "examples.json").write_text(json.dumps([{"image": os.path.relpath(_photo(vqa_run), tmp_path),
                                                          "question": "how many dogs ?"}]))
    proc, lines = _serve(vqa_run, port, str(tmp_path / "examples.json"))
    try:
        photo = _photo(vqa_run)
        # What the page must show, computed while the server starts.
        expected, = Predictor.from_checkpoint(
            VQA_CFG, vqa_run["ckpt"], opts=vqa_run["opts"], feature_weights=vqa_run["weights"],
            box_source={"kind": "grid", "grid": "2x2"})({"image": photo, "question": QUESTION}, topk=3)
        _wait_serving(proc, lines, port)
        driver.get("http://127.0.0.1:{}/".format(port))
        WebDriverWait(driver, 30).until(lambda d: "how many dogs ?" in d.find_element(By.TAG_NAME, "body").text)
        message, table = _ask(driver, photo, QUESTION)
        # The answers shown: the predictor's, best first, the scores to the table's 4 decimals.
        assert message == ""
        rows = [line.split() for line in table.splitlines()[1:]]
        _assert_table_shows(rows, expected["predictions"])
        assert driver.find_element(By.CSS_SELECTOR, "#answers h2").text == rows[0][1]
        assert rows[0][1] in _tied_best(expected["predictions"])
        assert len(driver.find_elements(By.CSS_SELECTOR, "#attention img")) == 6  # one tile per word
        assert driver.find_elements(By.CSS_SELECTOR, "#boxes img")
        driver.save_screenshot(str(tmp_path / "web_demo.png"))
        # The layer slider repaints the tiles (layer 2 alone).
        tiles = [e.get_attribute("src") for e in driver.find_elements(By.CSS_SELECTOR, "#attention img")]
        number = driver.find_element(By.CSS_SELECTOR, "#layer input[type=number]")
        number.clear()
        number.send_keys("2", Keys.TAB)
        WebDriverWait(driver, 30).until(lambda d: tiles != [e.get_attribute("src") for e in d.find_elements(
            By.CSS_SELECTOR, "#attention img")])

        # A file that is not an image: the message, no answers; the server answers the photo again after it.
        (tmp_path / "notes.jpg").write_text("not an image")
        message, table = _ask(driver, str(tmp_path / "notes.jpg"), QUESTION)
        assert message.startswith("error: 'notes.jpg' is not an image file") and table == ""
        driver.save_screenshot(str(tmp_path / "web_demo_error.png"))
        message, table = _ask(driver, photo, QUESTION)
        assert message == "" and table.splitlines()[1].split()[1] in _tied_best(expected["predictions"])

        # Offline: the page fetched nothing but this server (no CDN, no analytics).
        urls = {json.loads(e["message"])["message"]["params"]["request"]["url"]
                for e in driver.get_log("performance")
                if json.loads(e["message"])["message"]["method"] == "Network.requestWillBeSent"}
        assert urls and not [u for u in urls if not u.startswith(("http://127.0.0.1:{}/".format(port), "data:",
                                                                    "blob:"))]
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(30)


def test_serve_demo_refuses_a_port_in_use_before_loading_the_model():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        out = subprocess.run([sys.executable, SERVE, "--cfg", VQA_CFG, "--ckpt", "missing.model", "--port", str(port)],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip() == ("error: cannot serve on 127.0.0.1:{}: Address already in use; give another --port "
                                  "(or --host)".format(port))


def _random_photo(path):
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (36, 48, 3), dtype=np.uint8)).save(path)
    return str(path)


def test_an_expression_shows_the_chosen_box_and_a_caption_its_masked_words(refcoco_backend, pretrain_backend,
                                                                           tmp_path):
    photo = _random_photo(tmp_path / "photo.png")
    # RefCOCO+: the candidates by score, the best one drawn in red on top of the others.
    backend = refcoco_backend
    predictor = backend.predictor
    assert backend.text_field == "expression"
    result = backend(photo, "the red one")
    expected, = predictor({"image": photo, "expression": "the red one"}, topk=3)
    _same_predictions(result.prediction["predictions"], expected["predictions"])
    best = result.prediction["predictions"][0]  # drawn in red: the plain call's best box, or one tied with it
    assert any(p["box"] == pytest.approx(best["box"]) for p in expected["predictions"]
               if close(p["score"], expected["predictions"][0]["score"]))
    x1, _, x2, y2 = np.array(best["box"]) * DRAWN_SIDE / 48
    assert result.boxes_image.getpixel((int((x1 + x2) / 2), int(round(y2)))) == CHOSEN_COLOUR
    assert result.attention["regions"][1] - result.attention["regions"][0] == len(result.attention["boxes"])

    # Pretraining: the top word pieces of each [MASK], the first [MASK]'s in the page's label.
    backend = pretrain_backend
    predictor = backend.predictor
    assert backend.text_field == "caption"
    caption = CAPTION
    result = backend(photo, caption)
    expected, = predictor({"image": photo, "caption": caption}, topk=3)
    assert len(result.prediction["masks"]) == 2
    for shown, want in zip(result.prediction["masks"], expected["masks"]):
        _same_predictions(shown, want)
    if [m[0]["label"] for m in result.prediction["masks"]] == [m[0]["label"] for m in expected["masks"]]:
        assert result.prediction["filled"] == expected["filled"]  # (other words only where tied, accepted above)
    assert_ranking_close(list(result.scores.items()), _pairs(expected["masks"][0]), "the label's scores")
    assert "[MASK]" in [caption.split()[0] for _, caption in DemoBackend.attention_tiles(result.attention)]
    assert "no [MASK] word" in backend(photo, "a cat sits").message


def test_setup_env_names_an_unknown_option():
    out = subprocess.run(["bash", os.path.join(ROOT, "scripts", "setup_env.sh"), "--test", "--web"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip() == ("error: scripts/setup_env.sh: unknown option '--web' (expected --test and/or "
                                  "--demo)")


# ------------------------------------------------------------------------------- the page of every task, served
@contextlib.contextmanager
def _served(backend, examples, allowed):
    """``(url, gradio_client)`` of ``backend``'s page served in this process
    (:func:`common.inference.web_demo.launch`)."""
    from gradio_client import Client

    page = build_page(backend, examples, title="test")
    url = launch(page, port=_free_port(), allowed_paths=[allowed])
    try:
        yield url, Client(url + "/", verbose=False, download_files=False)
    finally:
        page.close()


def _same_ranking(shown, expected):
    """Same predictions (every [MASK]'s for a caption)."""
    ranked = [p["masks"] if "masks" in p else [p["predictions"]] for p in (shown, expected)]
    assert len(ranked[0]) == len(ranked[1])
    for got, want in zip(*ranked):
        _same_predictions(got, want)


def _answer(client, backend, path, text):
    """The page's Ask: ``(message without markup, the JSON prediction or None)``."""
    from gradio_client import handle_file

    args = [handle_file(path), text] + ([0] if backend.num_layers else [])  # the layer slider, when there is one
    out = client.predict(*args, api_name="/answer")
    return html.unescape(out[0]).replace("**error:** ", ""), out[5]


def test_every_tasks_page_answers_and_names_bad_files_in_one_line(vqa_run, vqa_backend, refcoco_backend,
                                                                  pretrain_backend, cls_backend, tmp_path,
                                                                  monkeypatch):
    """The pages of VQA, RefCOCO+, pretraining and cls, served and asked through gradio's client as a browser
    does: each builds (cls: no layer slider), answers a photo as its predictor does, a 16-bit PNG as its 8-bit
    scaling, and gives one line naming the uploaded file for a decompression bomb, a text file, a 1x1 photo
    and a text over the VL-BERT's positions; /config names no folder of the server; no upload stays on disk."""
    uploads = tmp_path / "gradio"
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(uploads))  # read when a page is built and served
    os.makedirs(tmp_path / "photos")
    photos = bad_photos(str(tmp_path / "photos"))
    photo = _random_photo(tmp_path / "photos" / "photo.png")
    grid_1x1 = "pixel.png: a 2x2 (rows x columns) grid does not fit an image of 1x1 pixels (width x height)"
    pages = [(vqa_backend, QUESTION, ("question", 604)), (refcoco_backend, "the red one", ("expression", 602)),
             (pretrain_backend, CAPTION, None), (cls_backend, "", None)]
    for backend, text, too_long in pages:
        with _served(backend, [(photo, text)], str(tmp_path / "photos")) as (url, client):
            config = urllib.request.urlopen(url + "/config").read().decode()
            assert "photo.png" in config and str(tmp_path) not in config
            message, shown = _answer(client, backend, photo, text)
            expected, = backend.predictor({"image": photo, backend.text_field or "image": text or photo}
                                          if backend.text_field else {"image": photo}, topk=backend.topk)
            assert message == ""
            _same_ranking(shown, expected)
            message, shown = _answer(client, backend, photos["16-bit"], text)
            _, eight_bit = _answer(client, backend, photos["16-bit expected"], text)
            assert message == ""
            _same_ranking(shown, eight_bit)
            assert _answer(client, backend, photos["bomb"], text)[0] == (
                "'huge scan.png' is over the limit of 20,000,000 pixels (20 Mpixels; Image size (196000000 pixels) "
                "exceeds limit of 178956970 pixels): resize it")
            assert _answer(client, backend, photos["text"], text)[0] == (
                "'my notes.jpg' is not an image file (PIL cannot read it as JPEG, PNG, ...: UnidentifiedImageError)")
            message, shown = _answer(client, backend, photos["1x1"], text)
            if backend.text_field:  # the 2x2 grid of regions does not fit; cls resizes it
                assert (message, shown) == (grid_1x1, None)
            else:
                assert message == "" and shown["predictions"]
            if too_long:
                message, _ = _answer(client, backend, photo, LONG_TEXT)
                assert message == ("photo.png: the text ({}) is {} tokens with the model's marks ([CLS], [SEP], ...), "
                                   "over the 126 that NETWORK.VLBERT.max_position_embeddings 128 leaves for text; "
                                   "shorten it".format(*too_long))
            elif backend.text_field:  # a caption: cut to DATASET.SEQ_LEN as in training, its first [MASK] kept
                message, shown = _answer(client, backend, photo, CAPTION + " " + LONG_TEXT)
                assert message == "" and shown["masks"]
        left = [n for _, _, names in os.walk(uploads) for n in names]
        assert not set(left) & {os.path.basename(p) for p in list(photos.values()) + [photo]}, left


def test_serve_demo_on_a_cls_checkpoint_answers_and_keeps_no_upload(cls_run, tmp_path):
    """tools/serve_demo.py on a cls checkpoint (no VL-BERT: no layer slider) starts and answers; /config names
    none of the server's folders (the demo photographs by name); the uploaded photo is deleted once answered."""
    from gradio_client import Client, handle_file

    port = _free_port()
    proc = subprocess.Popen([sys.executable, SERVE, "--cfg", cls_run["cfg"], "--ckpt", cls_run["ckpt"], "--port",
                             str(port), "--opts"] + cls_run["opts"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=dict(os.environ, TMPDIR=str(tmp_path)))
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        _wait_serving(proc, lines, port)
        url = "http://127.0.0.1:{}".format(port)
        config = urllib.request.urlopen(url + "/config").read().decode()
        assert "chelsea.jpg" in config and str(tmp_path) not in config
        # the page names the timm model it serves, not VL-BERT
        arch = load_task("cls").load_config(cls_run["cfg"], cls_run["opts"]).NETWORK.ARCH
        title = "{} classifier: {}".format(arch, os.path.basename(cls_run["ckpt"]))
        assert json.loads(config)["title"] == title, json.loads(config)["title"]
        photo = _random_photo(tmp_path / "my photo.png")
        out = Client(url + "/", verbose=False, download_files=False).predict(handle_file(photo), "",
                                                                              api_name="/answer")
        expected, = Predictor.from_checkpoint(cls_run["cfg"], cls_run["ckpt"], opts=cls_run["opts"])({"image": photo})
        assert out[0] == "" and out[5]["image"] == "my photo.png"
        assert out[2].splitlines()[0] == "| | class | score |"
        _same_predictions(out[5]["predictions"], expected["predictions"])
        private, = [p for p in os.listdir(tmp_path) if p.startswith("serve_demo-")]
        kept = [n for _, _, names in os.walk(tmp_path / private / "uploads") for n in names]
        assert "my photo.png" not in kept and proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(30)
