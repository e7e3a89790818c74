"""The VQA task: what VQA v2 adds to the shared engine (soft accuracy, the answer classifier's
initialisation from word embeddings, the EvalAI result JSON)."""
import torch

from common.data.tokenizer import build_tokenizer
from common.errors import UserInputError
from common.metrics.composite_eval_metric import CompositeEvalMetric
from common.metrics.loss_logger import loss_loggers
from common.modeling.vlbert_task import VLBertTask
from common.task import register_task
import vqa.data.vqa  # noqa: F401  (registers the 'vqa' dataset)
from vqa.data.answers import AnswerVocab
from vqa.function.config import VALUE_RULES, check_config, vqa_defaults
from vqa.function.metrics import SoftAccuracy
from vqa.function.onnx import VIT_REFUSAL, vqa_onnx_graph
from vqa.function.test import ResultJSON, result_json_path
from vqa.modules import MODELS

WORD_EMBEDDINGS = "word_embeddings.weight"


def answer_word_embeddings(model, answers, tokenizer):
    """Mean word embedding of each answer's word pieces, from ``model``'s (first) word-embedding table.

    Args:
        answers: answer strings, in output order.
    Returns:
        float (len(answers), H), on the table's device.
    """
    table = next(p for name, p in model.named_parameters() if name.endswith(WORD_EMBEDDINGS)).detach()
    # the index on the CPU: built on the meta device under fsdp (common.parallel.meta_init), a list index would
    # become a meta tensor without values
    rows = [table[torch.tensor(tokenizer.convert_tokens_to_ids(tokenizer.tokenize(a)), device="cpu")].mean(0)
            for a in answers]
    return torch.stack(rows)


def init_classifier_from_answers(model, cfg):
    """NETWORK.CLASSIFIER_PRETRAINED: the classifier's last layer gets, per answer, the mean word
    embedding of its word pieces (the reference's rule, applied after the partial pretrain is loaded).

    Raises:
        UserInputError: the last layer's input is not the word-embedding width (CLASSIFIER_TYPE '2fc'
            with CLASSIFIER_HIDDEN_SIZE != hidden size).
    """
    vocab = AnswerVocab.from_file(cfg.DATASET.ANSWER_VOCAB_FILE)
    weight = answer_word_embeddings(model, vocab.answers, build_tokenizer(cfg.NETWORK.BERT_MODEL_NAME))
    last = model.final_mlp[-1]
    if tuple(last.weight.shape) != tuple(weight.shape):
        raise UserInputError("NETWORK.CLASSIFIER_PRETRAINED: the classifier's last layer is {} but the answers' "
                             "word embeddings are {}; use CLASSIFIER_TYPE 'mlm' or '1fc'".format(
                                 tuple(last.weight.shape), tuple(weight.shape)))
    with torch.no_grad():
        last.weight.copy_(weight)


class VQATask(VLBertTask):
    """VQA v2: classify the answer over DATASET.ANSWER_VOCAB_FILE from the output at [MASK]."""
    name = "vqa"
    models = MODELS
    host_metric_name = "SoftAcc"
    value_rules = VALUE_RULES
    onnx_refusal = None

    defaults = staticmethod(vqa_defaults)

    def build_metrics(self, cfg, for_training):
        """Soft accuracy 'SoftAcc', plus the TRAIN.LOSS_LOGGERS losses while training."""
        metrics = CompositeEvalMetric([SoftAccuracy()])
        if for_training:
            for metric in loss_loggers(cfg.TRAIN.LOSS_LOGGERS):
                metrics.add(metric)
        return metrics

    def check_config(self, cfg, source="config"):
        """The config keys (:func:`vqa.function.config.check_config`), then DATASET.ANSWER_VOCAB_SIZE
        against DATASET.ANSWER_VOCAB_FILE, before the classifier is built from the size.

        Raises:
            common.config.ConfigError: a value the task refuses (names the key).
            AnswerVocabError: the file has another number of answers, or is malformed.
        """
        check_config(cfg, source)
        try:
            vocab = AnswerVocab.from_file(cfg.DATASET.ANSWER_VOCAB_FILE)
        except FileNotFoundError:  # reported with the data set's other missing files
            return
        vocab.check_size(cfg.DATASET.ANSWER_VOCAB_SIZE)

    def init_after_pretrain(self, cfg, model):
        if cfg.NETWORK.CLASSIFIER_PRETRAINED:
            init_classifier_from_answers(model, cfg)

    def run_info(self, cfg, dataset):
        """The answer vocabulary (``answers``), which a predictor checks against the config's file."""
        return {"answers": list(dataset.answer_vocab.answers)} if dataset is not None else {}

    def predictor(self, cfg, ckpt, ckpt_path, device, feature_weights=None, box_source=None):
        """:class:`vqa.predict.VQAPredictor`."""
        from vqa.predict import VQAPredictor
        return VQAPredictor(self, cfg, ckpt, ckpt_path, device, feature_weights, box_source)

    def test_evaluator(self, cfg, dataset, save_path, save_name):
        """Writes ``{save_path}/{save_name}_vqa2_{TEST_IMAGE_SET}.json``: ``[{"question_id": int, "answer": str}]``
        with every question of the split once, gathered over the ranks (written by rank 0)."""
        return ResultJSON(dataset, result_json_path(save_path, save_name, cfg.DATASET.TEST_IMAGE_SET))

    def onnx_export_refusal(self, cfg):
        """The ViT image encoder on pixels (:data:`vqa.function.onnx.VIT_REFUSAL`); else None."""
        net = cfg.NETWORK
        return VIT_REFUSAL if not net.IMAGE_FEAT_PRECOMPUTED and net.IMAGE_ENCODER == "vit" else None

    def onnx_graph(self, cfg, model):
        """``boxes`` (+ ``image`` without precomputed features), ``im_info``, ``question`` -> ``label_logits``
        (:func:`vqa.function.onnx.vqa_onnx_graph`)."""
        return vqa_onnx_graph(cfg, model)

    def handoff_files(self, cfg):
        """``answers.txt``: DATASET.ANSWER_VOCAB_FILE (one answer a line, in the classifier's order)."""
        with open(cfg.DATASET.ANSWER_VOCAB_FILE, encoding="utf-8") as f:
            return {"answers.txt": ("DATASET.ANSWER_VOCAB_FILE", f.read())}


TASK = register_task(VQATask())
