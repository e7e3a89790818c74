"""WordPiece tokenizer from a local BERT folder (``NETWORK.BERT_MODEL_NAME``)."""
import json
import os

from pytorch_pretrained_bert import BertTokenizer

PREPARE_DOC = "model/pretrained_model/PREPARE_PRETRAINED_MODELS.md"


def _lower_case(folder):
    """Casing of a BERT folder: ``tokenizer_config.json`` (Hugging Face layout) decides when
    present; otherwise a folder named like ``*-cased`` keeps case and everything else is
    lower-cased, as the reference's ``BertTokenizer.from_pretrained`` default does."""
    config = os.path.join(folder, "tokenizer_config.json")
    if os.path.isfile(config):
        with open(config) as f:
            value = json.load(f).get("do_lower_case")
        if value is not None:
            return bool(value)
    name = os.path.basename(os.path.normpath(folder)).lower()
    return not (name.endswith("-cased") or "_cased" in name or "-cased-" in name)


def build_tokenizer(bert_model_name, do_lower_case=None):
    """``pytorch_pretrained_bert.BertTokenizer`` reading ``vocab.txt`` from a BERT folder.

    Args:
        bert_model_name (str): folder holding ``vocab.txt`` (reference layout
            ``bert-base-uncased/{vocab.txt, bert_config.json, pytorch_model.bin}`` or a
            Hugging Face folder), or the path of a ``vocab.txt`` itself. Hub names such as
            ``'bert-base-uncased'`` are not downloaded: put the files in a folder.
        do_lower_case (bool or None): ``None`` decides from the folder (see ``_lower_case``).
    Raises:
        FileNotFoundError: no ``vocab.txt`` there; the message names the folder and the
            document that explains how to get it.
    """
    if not bert_model_name:
        raise FileNotFoundError(
            "NETWORK.BERT_MODEL_NAME is empty: the text is tokenised with the BERT folder's vocab.txt, so a "
            "folder is needed even for a randomly initialised model; see {}".format(PREPARE_DOC))
    path = os.path.expanduser(bert_model_name)
    if os.path.isfile(path):
        vocab, folder = path, os.path.dirname(path)
    else:
        vocab, folder = os.path.join(path, "vocab.txt"), path
    if not os.path.isfile(vocab):
        raise FileNotFoundError(
            "BERT folder '{}' has no vocab.txt (NETWORK.BERT_MODEL_NAME must be a local folder with "
            "vocab.txt, bert_config.json and pytorch_model.bin); see {}".format(bert_model_name, PREPARE_DOC))
    if do_lower_case is None:
        do_lower_case = _lower_case(folder)
    return BertTokenizer(vocab, do_lower_case=do_lower_case)
