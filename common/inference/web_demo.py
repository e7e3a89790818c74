"""The web page of ``tools/serve_demo.py``: a photo and a text in, the predictor's answers, the boxes and the
attention of the text's words over the regions out.

Two parts: :class:`DemoBackend`, the page's function (no gradio: it reads the photo, calls the
:class:`common.inference.Predictor` and draws what the page shows), and :func:`build_page`, the gradio page on it.
"""
import contextlib
import html
import os

import numpy as np
from PIL import Image, UnidentifiedImageError

from common.data.loading import load_image
from common.errors import UserInputError
from common.inference.drawing import draw_boxes, paint_regions, thumbnail

__all__ = ["MAX_PIXELS", "DemoBackend", "DemoResult", "build_page", "launch", "read_photo"]

# Largest photo the page accepts, pixels (width x height): a 20-Mpixel photo decodes to 60 MB of RGB, and the
# page serves one model call at a time on a shared machine.
MAX_PIXELS = 20_000_000
# The page's label of each text input a task takes.
TEXT_LABELS = {"question": "question", "caption": "caption with [MASK] words", "expression": "referring expression"}
# Longest side of the drawn images, pixels (the boxes' labels stay readable, the page stays light); smaller
# photos are enlarged to it.
DRAWN_SIDE = 512
# gradio's cache of the drawn images the page sent: every CACHE_SWEEP_S seconds, those older than CACHE_AGE_S
# are deleted (``gradio.Blocks(delete_cache=...)``); an uploaded photo is deleted once answered.
CACHE_SWEEP_S, CACHE_AGE_S = 60, 600


def read_photo(path, name=None, max_pixels=MAX_PIXELS):
    """The RGB ``PIL.Image`` of an uploaded photo, refused before decoding when it is too large.

    Args:
        path (str or None): the file. name (str): how messages name it (the uploaded file's own name).
        max_pixels (int): the largest width x height accepted.
    Raises:
        UserInputError: no file, not an image, an image over ``max_pixels`` or over Pillow's decompression-bomb
            guard (says the limit), or a truncated or otherwise undecodable image (each message names the file).
    """
    if not path:
        raise UserInputError("no photo: upload one or pick a demo photograph")
    name = name or os.path.basename(path)
    try:
        with Image.open(path) as header:  # reads the header only: the size before any pixel is decoded
            width, height = header.size
    except Image.DecompressionBombError as e:  # over twice PIL.Image.MAX_IMAGE_PIXELS: refused by Pillow's open
        raise UserInputError("'{}' is over the limit of {:,} pixels ({:g} Mpixels; {}): resize it".format(
            name, max_pixels, max_pixels / 1e6, str(e).split(", could be")[0])) from None
    except (UnidentifiedImageError, OSError) as e:
        raise UserInputError("'{}' is not an image file (PIL cannot read it as JPEG, PNG, ...: {})".format(
            name, type(e).__name__)) from None
    if width * height > max_pixels:
        raise UserInputError("'{}' is {} x {} = {:,} pixels, over the limit of {:,} ({:g} Mpixels): resize it".format(
            name, width, height, width * height, max_pixels, max_pixels / 1e6))
    try:
        return load_image(path)
    except UserInputError as e:
        raise UserInputError(str(e).replace(path, name)) from None


class DemoResult:
    """What the page shows for one request.

    Attributes:
        message (str): empty, or what went wrong (a bad input), for the page's message line.
        prediction (dict or None): the predictor's output for the input (``tools/predict.py``'s JSON object).
        scores (dict): ``{label: score}`` of the best answers, best first (the first ``[MASK]``'s words for a
            caption), for ``gradio.Label``.
        boxes_image (PIL.Image or None): the photo with its numbered boxes (the chosen one in red).
        attention (dict or None): the input's attention (:meth:`common.inference.Predictor.attention` less its
            ``result``; see :meth:`DemoBackend.attention_tiles`).
    """

    def __init__(self, message="", prediction=None, scores=None, boxes_image=None, attention=None):
        self.message, self.prediction, self.scores = message, prediction, scores or {}
        self.boxes_image, self.attention = boxes_image, attention


class DemoBackend:
    """The page's function on a predictor: ``backend(photo_path, text)`` -> :class:`DemoResult`.

    Args:
        predictor: a :class:`common.inference.Predictor`.
        topk (int): answers kept (per ``[MASK]``).
        max_pixels (int): the largest photo accepted (:func:`read_photo`).
    Attributes:
        text_field (str or None): the input's text key (``question``, ``caption``, ``expression``); None: the
            photo alone (cls).
        output_noun (str): what one ranked output is called (``answer``, or ``class`` for cls).
    Raises:
        UserInputError: a predictor of a task the page cannot serve (VCR needs 4 answers: tools/predict.py).
    """

    def __init__(self, predictor, topk=5, max_pixels=MAX_PIXELS):
        self.predictor, self.topk, self.max_pixels = predictor, topk, max_pixels
        self.task_name = predictor.task.name
        texts = [k for k in predictor.task_predictor.fields if k != "boxes"]
        if len(texts) > 1 or texts and texts[0] not in TEXT_LABELS:
            raise UserInputError("the web page takes a photo and one text; a {} checkpoint takes {} (use "
                                 "tools/predict.py)".format(self.task_name, ", ".join(texts)))
        self.text_field = texts[0] if texts else None
        # what one ranked output is called on the page: a class of a classifier, else an answer
        self.output_noun = "answer" if self.text_field else "class"

    @property
    def num_layers(self):
        """Layers of the VL-BERT (0 for a model without text, cls)."""
        return self.predictor.cfg.NETWORK.VLBERT.num_hidden_layers if self.text_field else 0

    def __call__(self, path, text="", name=None):
        """Answer one request; a bad input gives a result with only ``message`` set (never an exception).

        One forward: the predictor's own call (:meth:`common.inference.Predictor.attention` for a model with text,
        which also keeps the VL-BERT's attention).
        Args:
            path (str or None): the photo file. text (str): the question, caption or expression (ignored for
                cls). name (str): how messages name the photo (default: its file name).
        """
        name = name or (os.path.basename(path) if path else None)
        attention = None
        try:
            image = read_photo(path, name, self.max_pixels)
            item = {"image": image}
            if self.text_field:
                item[self.text_field] = (text or "").strip()
                attention = self.predictor.attention(item, topk=self.topk, name=name)
                prediction = attention.pop("result")
            else:
                prediction, = self.predictor([item], topk=self.topk, names=[name])
        except UserInputError as e:
            return DemoResult(message=str(e))
        prediction = dict(prediction, image=name)
        ranked = prediction["masks"][0] if "masks" in prediction else prediction["predictions"]
        drawn = None
        if attention is not None:  # the regions the VL-BERT saw, the chosen one (RefCOCO+) in red
            chosen = prediction["predictions"][0]["index"] if self.task_name == "refcoco" else None
            drawn = draw_boxes(*thumbnail(image, attention["boxes"], DRAWN_SIDE, enlarge=True), chosen)
        return DemoResult(prediction=prediction, scores={p["label"]: p["score"] for p in ranked},
                          boxes_image=drawn, attention=attention)

    @staticmethod
    def attention_tiles(attention, layer=0):
        """The photo painted with each text word's attention over the regions, one tile per word.

        Args:
            attention (dict): the record of one input (:attr:`DemoResult.attention`): ``probs`` float
                ``[layers, heads, T, T]``
                (row q: token q's attention over all tokens), ``tokens`` (T strings), ``text`` and ``regions``
                (``[start, end)`` token ranges), ``boxes`` (``[R, 4]`` pixels of ``image``), ``image``
                (``PIL.Image``).
            layer (int): 0: the mean over layers and heads; ``l >= 1``: the mean over layer l's heads.
        Returns:
            list of ``(PIL.Image, caption)``: one per word ([CLS] / [SEP] left out), captioned with the word and
            its largest attention to a region; all tiles on one colour scale (0 to the largest value shown).
        Raises:
            UserInputError: ``layer`` outside ``0 .. layers``.
        """
        probs = np.asarray(attention["probs"], dtype=np.float64)
        if not 0 <= layer <= len(probs):
            raise UserInputError("layer {} does not exist: 0 (mean) to {}".format(layer, len(probs)))
        mean = probs.mean(axis=(0, 1)) if layer == 0 else probs[layer - 1].mean(axis=0)
        tokens, (t0, t1), (r0, r1) = attention["tokens"], attention["text"], attention["regions"]
        words = [q for q in range(t0, t1) if tokens[q] not in ("[CLS]", "[SEP]")] or list(range(t0, t1))
        values = mean[words, r0:r1]  # [words, regions]
        thumb, boxes = thumbnail(attention["image"], attention["boxes"], DRAWN_SIDE, enlarge=True)
        vmax = float(values.max()) or 1.0
        return [(paint_regions(thumb, boxes, row / vmax), "{} {:.3f}".format(tokens[q], row.max()))
                for q, row in zip(words, values)]


def _answers_markdown(prediction, noun="answer"):
    """The prediction as a Markdown table (every ``[MASK]`` of a caption; the chosen box of an expression); its
    label column is headed ``noun``."""
    lists = prediction.get("masks") or [prediction["predictions"]]
    lines = []
    for m, ranked in enumerate(lists, 1):
        if len(lists) > 1:
            lines.append("\n**[MASK] {}**\n".format(m))
        lines += ["| | {} | score |".format(noun), "|---|---|---|"]
        lines += ["| {} | {} | {:.4f} |".format(k, html.escape(p["label"]), p["score"])
                  for k, p in enumerate(ranked, 1)]
    return "\n".join(lines)


def _remove_upload(path, upload_folder):
    """Delete an uploaded photo (and its folder, gradio's one per upload) once answered; files outside
    ``upload_folder`` (gradio's cache) are left alone."""
    if not path or os.path.commonpath([os.path.abspath(path), upload_folder]) != upload_folder:
        return
    with contextlib.suppress(OSError):
        os.remove(path)
        os.rmdir(os.path.dirname(path))


def build_page(backend, examples=(), title="VL-BERT"):
    """The gradio page on ``backend`` (:class:`DemoBackend`); the caller launches it.

    The page's configuration (``/config``) names no file of the server: the demo photographs are listed by
    name and text, and one is sent to the photo input when picked. An uploaded photo is deleted once answered;
    the drawn images gradio keeps are deleted after :data:`CACHE_AGE_S` seconds.

    Args:
        backend (DemoBackend): the page's function.
        examples: ``(photo path, text)`` pairs offered under the inputs ("pick a demo photograph").
        title (str): the page's title.
    Returns:
        ``gradio.Blocks`` with a queue of one model call at a time.
    """
    import gradio as gr
    from gradio.utils import get_upload_folder

    upload_folder = os.path.abspath(get_upload_folder())
    text_label = TEXT_LABELS.get(backend.text_field)
    examples = list(examples)
    with gr.Blocks(title=title, analytics_enabled=False, delete_cache=(CACHE_SWEEP_S, CACHE_AGE_S)) as page:
        gr.Markdown("## {}".format(html.escape(title)))
        with gr.Row():
            with gr.Column():
                photo = gr.Image(type="filepath", label="photo", sources=["upload", "clipboard"], elem_id="photo")
                text = gr.Textbox(label=text_label or "text", visible=text_label is not None, elem_id="text",
                                  lines=1, max_lines=3)
                ask = gr.Button("Ask" if text_label else "Classify", variant="primary", elem_id="ask")
                if examples:  # names only: a file path here would show the server's folders in /config
                    picker = gr.Dataset(components=[gr.Textbox(visible=False), gr.Textbox(visible=False)],
                                        samples=[[os.path.basename(p), t] for p, t in examples], type="index",
                                        headers=["photo", text_label or ""], label="demo photographs",
                                        elem_id="examples")
            with gr.Column():
                message = gr.Markdown(elem_id="message")
                scores = gr.Label(label="top answers" if text_label else "top classes", elem_id="answers")
                if backend.num_layers:
                    layer = gr.Slider(0, backend.num_layers, value=0, step=1, elem_id="layer",
                                      label="attention layer (0: mean over all layers)")
                else:  # no VL-BERT (cls): no attention to choose a layer of
                    layer = gr.State(0)
                tiles = gr.Gallery(label="attention of each word over the regions", elem_id="attention",
                                   columns=4, height="auto", format="png", visible=text_label is not None)
                boxes = gr.Image(label="regions (numbered as in the attention)", elem_id="boxes",
                                 interactive=False, format="png", visible=text_label is not None)
                table = gr.Markdown(elem_id="table")
                with gr.Accordion("JSON (as tools/predict.py writes it)", open=False):
                    raw = gr.JSON(elem_id="json")
        attention = gr.State()

        def answer(photo_data, question, chosen_layer):
            # preprocess=False: the upload arrives as gradio's file record, read here with the page's own checks
            path = (photo_data or {}).get("path")
            result = backend(path, question, name=(photo_data or {}).get("orig_name"))
            _remove_upload(path, upload_folder)
            if result.message:
                return ("**error:** {}".format(html.escape(result.message)), None, "", None, [], None, None)
            shown = backend.attention_tiles(result.attention, int(chosen_layer)) if result.attention else []
            table_md = _answers_markdown(result.prediction, backend.output_noun)
            return ("", result.scores, table_md, result.boxes_image, shown,
                    result.prediction, result.attention)

        def repaint(record, chosen_layer):
            return backend.attention_tiles(record, int(chosen_layer)) if record else []

        if examples:
            picker.click(lambda k: examples[k], picker, [photo, text])
        ask.click(answer, [photo, text, layer], [message, scores, table, boxes, tiles, raw, attention],
                  preprocess=False, concurrency_limit=1, concurrency_id="model")
        if backend.num_layers:
            layer.change(repaint, [attention, layer], tiles, concurrency_limit=1, concurrency_id="model",
                         trigger_mode="always_last")
    return page.queue(default_concurrency_limit=1, max_size=32)


def launch(page, host="127.0.0.1", port=7860, allowed_paths=()):
    """Serve ``page`` (from :func:`build_page`) offline in a background thread; returns its URL once it answers.

    No share link, no server-side rendering, a footer with the settings link only; the theme uses the system's
    fonts, so the browser
    fetches nothing but this server (gradio's default theme loads its fonts from a CDN). Analytics are off
    when ``GRADIO_ANALYTICS_ENABLED=False`` is set before gradio is imported (``tools/serve_demo.py``).
    Args:
        allowed_paths: folders whose files the page may serve (the example photos).
    Raises:
        UserInputError: the port is in use or the address cannot be bound (names them).
    """
    import urllib.request

    import gradio as gr

    theme = gr.themes.Default(font=["ui-sans-serif", "system-ui", "sans-serif"],
                              font_mono=["ui-monospace", "monospace"])
    try:
        page.launch(server_name=host, server_port=port, share=False, prevent_thread_lock=True, quiet=True,
                    show_error=True, ssr_mode=False, footer_links=["settings"], theme=theme,
                    allowed_paths=list(allowed_paths), max_file_size="200mb")
    except OSError as e:
        raise UserInputError("cannot serve on {}:{} ({}); is the port in use? give another with --port".format(
            host, port, str(e).split(".")[0])) from None
    url = "http://{}:{}".format(host, port)
    urllib.request.urlopen(url + "/", timeout=30).read(1)  # the page answers (launch returns once it is up)
    return url
