"""Read pretrained BERT folders (``NETWORK.BERT_MODEL_NAME``) in the reference or the Hugging Face layout.

Reference layout (Google's BERT converted by ``pytorch_pretrained_bert``): ``bert_config.json``,
``pytorch_model.bin`` with ``bert.``-prefixed keys and LayerNorm ``gamma``/``beta``, ``vocab.txt``.
Hugging Face layout: ``config.json``, ``model.safetensors`` or ``pytorch_model.bin`` with or without the
``bert.`` prefix and LayerNorm ``weight``/``bias``, ``vocab.txt``.

Both are turned into one canonical form: encoder keys without prefix (``embeddings.*``, ``encoder.*``,
``pooler.*``), head keys as BERT's (``cls.predictions.*``, ``cls.seq_relationship.*``), LayerNorm
``weight``/``bias``.
"""
import json
import os
import re
import warnings


from common.errors import UserInputError
from common.fileio.safe_load import load_tensors
from common.modeling.module import RandomInitWarning, pretrained_weights_skipped
from common.runtime.logs import get_logger

logger = get_logger(__name__)

CONFIG_FILES = ('bert_config.json', 'config.json')
WEIGHT_FILES = ('model.safetensors', 'pytorch_model.bin')
VOCAB_FILE = 'vocab.txt'
# Architecture keys that must agree between the folder's config and NETWORK.VLBERT.
ARCHITECTURE_KEYS = ('hidden_size', 'num_hidden_layers', 'num_attention_heads', 'intermediate_size',
                     'vocab_size', 'max_position_embeddings', 'hidden_act')
_ENCODER_PREFIXES = ('embeddings.', 'encoder.', 'pooler.')
# Buffers some Hugging Face versions save; they are not weights.
_IGNORED_KEYS = ('embeddings.position_ids',)


def _first_existing(folder, names, what):
    for name in names:
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError("BERT folder '{}' has no {} file (looked for {})".format(
        folder, what, ' or '.join(names)))


def bert_folder_files(folder):
    """Config and weight files of a BERT folder.

    Returns:
        (config_path, weights_path); the reference names win over the Hugging Face ones.
    Raises:
        FileNotFoundError: the folder does not exist, or holds no config / no weights file (the message
            names the folder and the files looked for).
    """
    if not os.path.isdir(folder):
        raise FileNotFoundError("NETWORK.BERT_MODEL_NAME: BERT folder '{}' does not exist".format(folder))
    return (_first_existing(folder, CONFIG_FILES, 'config'),
            _first_existing(folder, WEIGHT_FILES, 'weights'))


def read_bert_config(path):
    """The JSON config of a BERT folder as a dict; ValueError naming the file if it is not valid JSON."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise UserInputError("cannot read BERT config '{}': {}".format(path, e)) from e


def check_bert_config(bert_config, vlbert_config, path):
    """Raise ValueError when the folder's architecture differs from ``NETWORK.VLBERT``.

    ``num_hidden_layers`` may be smaller than the folder's: the model then takes the first layers.

    Args:
        bert_config: dict read from the folder's config file.
        vlbert_config: the ``NETWORK.VLBERT`` node.
        path: config file path, for the message.
    """
    for key in ARCHITECTURE_KEYS:
        if key not in bert_config:
            continue
        ours = getattr(vlbert_config, key)
        # Fewer layers than the folder is fine: the first ones are loaded (a small, fast model).
        if key == 'num_hidden_layers' and 0 < ours <= bert_config[key]:
            continue
        if bert_config[key] != ours:
            raise UserInputError("{}: {}={!r} but NETWORK.VLBERT.{}={!r}; set NETWORK.VLBERT to the pretrained "
                             "model's architecture".format(path, key, bert_config[key], key,
                                                           getattr(vlbert_config, key)))


def canonical_key(key):
    """Canonical name of one BERT checkpoint key (drops ``bert.``/``roberta.``, LayerNorm gamma/beta -> weight/bias)."""
    for prefix in ('bert.', 'roberta.'):
        if key.startswith(prefix):
            key = key[len(prefix):]
            break
    key = re.sub(r'LayerNorm\.gamma$', 'LayerNorm.weight', key)
    return re.sub(r'LayerNorm\.beta$', 'LayerNorm.bias', key)


def read_bert_weights(path):
    """Load a BERT weights file (``.safetensors`` or a torch pickle) into canonical keys.

    Returns:
        dict canonical key -> tensor (on CPU, dtype as stored).
    Raises:
        ValueError: the file cannot be read or asks to run code (``UnreadableFileError``, nothing is run), or
            holds no BERT encoder keys (the message names the file).
    """
    raw = load_tensors(path, 'BERT weights')
    if not isinstance(raw, dict):
        raise UserInputError("BERT weights '{}' hold a {}, expected a state dict".format(path, type(raw).__name__))
    weights = {canonical_key(k): v for k, v in raw.items() if canonical_key(k) not in _IGNORED_KEYS}
    if not any(k.startswith(_ENCODER_PREFIXES) for k in weights):
        raise UserInputError("BERT weights '{}' contain no 'embeddings.*'/'encoder.*' keys (with or without "
                         "'bert.'); first keys: {}".format(path, list(raw)[:5]))
    return weights


def load_bert_folder(folder, vlbert_config):
    """Check and read a BERT folder.

    Args:
        folder: ``NETWORK.BERT_MODEL_NAME``.
        vlbert_config: ``NETWORK.VLBERT``; its architecture must match the folder's config.
    Returns:
        (canonical state dict, weights file path).
    Raises:
        FileNotFoundError / ValueError as ``bert_folder_files``, ``check_bert_config``, ``read_bert_weights``.
    """
    config_path, weights_path = bert_folder_files(folder)
    check_bert_config(read_bert_config(config_path), vlbert_config, config_path)
    return read_bert_weights(weights_path), weights_path


def language_pretrained_weights(network_config):
    """Pretrained language weights selected by a task config, as the reference release chooses them.

    ``NETWORK.BERT_PRETRAINED`` (``{path}-{epoch:04d}.model``, a BERT state dict) wins over the
    ``NETWORK.BERT_MODEL_NAME`` folder; an empty folder name means random initialisation (warning).

    Returns:
        (canonical state dict or None, source path or None).
    Raises:
        FileNotFoundError: a named file or folder does not exist; ValueError: unreadable or mismatched files.
    """
    if pretrained_weights_skipped():  # a checkpoint replaces them (common.modeling.module.checkpoint_sets_weights)
        if network_config.BERT_MODEL_NAME != '':
            path = _first_existing(network_config.BERT_MODEL_NAME, CONFIG_FILES, 'config')
            check_bert_config(read_bert_config(path), network_config.VLBERT, path)
        return None, None
    if network_config.BERT_PRETRAINED != '':
        path = '{}-{:04d}.model'.format(network_config.BERT_PRETRAINED, network_config.BERT_PRETRAINED_EPOCH)
        if not os.path.isfile(path):
            raise FileNotFoundError("NETWORK.BERT_PRETRAINED: weights file '{}' does not exist".format(path))
        return read_bert_weights(path), path
    if network_config.BERT_MODEL_NAME == '':
        warnings.warn(RandomInitWarning("NETWORK.BERT_MODEL_NAME is empty: the language model is randomly "
                                        "initialised"))
        return None, None
    return load_bert_folder(network_config.BERT_MODEL_NAME, network_config.VLBERT)


# Ids of the special tokens in BERT's standard uncased/cased vocabularies, used when no folder is given.
DEFAULT_SPECIAL_IDS = {'[PAD]': 0, '[UNK]': 100, '[CLS]': 101, '[SEP]': 102, '[MASK]': 103}


def special_token_ids(folder):
    """Ids of [PAD], [UNK], [CLS], [SEP], [MASK] in ``folder/vocab.txt`` (one token per line).

    An empty ``folder`` gives BERT's standard ids (0, 100, 101, 102, 103).

    Raises:
        FileNotFoundError: the folder or its ``vocab.txt`` is missing; ValueError: a special token is not in it.
    """
    if folder == '':
        return dict(DEFAULT_SPECIAL_IDS)
    if not os.path.isdir(folder):
        raise FileNotFoundError("NETWORK.BERT_MODEL_NAME: BERT folder '{}' does not exist".format(folder))
    path = os.path.join(folder, VOCAB_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError("BERT folder '{}' has no {}".format(folder, VOCAB_FILE))
    index = {}
    with open(path, encoding='utf-8') as f:
        for i, line in enumerate(f):
            index.setdefault(line.rstrip('\n'), i)
    missing = [t for t in DEFAULT_SPECIAL_IDS if t not in index]
    if missing:
        raise UserInputError("{} lacks the special tokens {}".format(path, missing))
    return {t: index[t] for t in DEFAULT_SPECIAL_IDS}
