"""The base of the tasks whose model is VL-BERT: the pretrained files its config names and the
partial-pretrain checkpoint (keys of :func:`common.modeling.vlbert_config.add_vlbert_config`)."""
from common.modeling.image_encoder import check_checkpoint_encoder, image_weights_input
from common.task import Input, Task


class VLBertTask(Task):
    """A :class:`common.task.Task` whose defaults include :func:`common.modeling.vlbert_config.add_vlbert_config`."""
    partial_pretrain_key = "NETWORK.PARTIAL_PRETRAIN"

    def inputs(self, cfg):
        """The data folders (:meth:`common.task.Task.inputs`), then the BERT folder, the image encoder weights
        (unless the boxes come with features; :func:`common.modeling.image_encoder.image_weights_input`) and the
        NETWORK.PARTIAL_PRETRAIN checkpoint the config names."""
        net = cfg.NETWORK
        inputs = super().inputs(cfg)
        if net.BERT_MODEL_NAME:
            inputs.append(Input("NETWORK.BERT_MODEL_NAME", "BERT folder", net.BERT_MODEL_NAME, is_dir=True))
        image_weights = image_weights_input(net)
        if image_weights is not None:
            inputs.append(Input("NETWORK.IMAGE_PRETRAINED", *image_weights))
        if net.PARTIAL_PRETRAIN:
            inputs.append(Input("NETWORK.PARTIAL_PRETRAIN", "checkpoint", net.PARTIAL_PRETRAIN))
        return inputs

    def model_title(self, cfg):
        """``"VL-BERT <task>"`` (e.g. ``VL-BERT vqa``)."""
        return "VL-BERT {}".format(self.name)

    def partial_pretrain(self, cfg):
        """``(NETWORK.PARTIAL_PRETRAIN, NETWORK.PARTIAL_PRETRAIN_PREFIX_CHANGES)``, or None when no file is set."""
        net = cfg.NETWORK
        return (net.PARTIAL_PRETRAIN, net.PARTIAL_PRETRAIN_PREFIX_CHANGES) if net.PARTIAL_PRETRAIN else None

    def check_checkpoint(self, cfg, ckpt, source):
        """The checkpoint's image encoder is the config's NETWORK.IMAGE_ENCODER
        (:func:`common.modeling.image_encoder.check_checkpoint_encoder`; UserInputError naming both)."""
        check_checkpoint_encoder(cfg, ckpt, source)
