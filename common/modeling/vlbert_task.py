"""The base of the tasks whose model is VL-BERT: the pretrained files its config names and the
partial-pretrain checkpoint (keys of :func:`common.modeling.vlbert_config.add_vlbert_config`)."""
from common.task import Input, Task


class VLBertTask(Task):
    """A :class:`common.task.Task` whose defaults include :func:`common.modeling.vlbert_config.add_vlbert_config`."""
    partial_pretrain_key = "NETWORK.PARTIAL_PRETRAIN"

    def inputs(self, cfg):
        """The data folders (:meth:`common.task.Task.inputs`), then the BERT folder, the ResNet weights (unless
        the boxes come with features) and the NETWORK.PARTIAL_PRETRAIN checkpoint the config names."""
        net = cfg.NETWORK
        inputs = super().inputs(cfg)
        if net.BERT_MODEL_NAME:
            inputs.append(Input("NETWORK.BERT_MODEL_NAME", "BERT folder", net.BERT_MODEL_NAME, is_dir=True))
        if net.IMAGE_PRETRAINED and not net.IMAGE_FEAT_PRECOMPUTED:
            image_weights = "{}-{:04d}.model".format(net.IMAGE_PRETRAINED, net.IMAGE_PRETRAINED_EPOCH)
            inputs.append(Input("NETWORK.IMAGE_PRETRAINED", "ResNet weights", image_weights))
        if net.PARTIAL_PRETRAIN:
            inputs.append(Input("NETWORK.PARTIAL_PRETRAIN", "checkpoint", net.PARTIAL_PRETRAIN))
        return inputs

    def partial_pretrain(self, cfg):
        """``(NETWORK.PARTIAL_PRETRAIN, NETWORK.PARTIAL_PRETRAIN_PREFIX_CHANGES)``, or None when no file is set."""
        net = cfg.NETWORK
        return (net.PARTIAL_PRETRAIN, net.PARTIAL_PRETRAIN_PREFIX_CHANGES) if net.PARTIAL_PRETRAIN else None
