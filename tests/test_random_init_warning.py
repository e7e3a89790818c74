"""RandomInitWarning reaches the user only when the weights really stay random: a partial pretrain file
that fills the part drops it, one that does not keeps it, and a strict checkpoint load drops it."""
import warnings

import torch
from torch import nn
from yacs.config import CfgNode

from common.checkpoint import checkpointer as ck
from common.engine import build_model, load_for_inference
from common.modeling.module import RandomInitWarning, held_random_init_warnings, warn_random_init
from common.task import Task

MESSAGE = "NETWORK.IMAGE_PRETRAINED is empty: the backbone keeps its random initialisation"


class Net(nn.Module):
    """A backbone without pretrained weights (warned) and a head."""

    def __init__(self, config=None):
        super().__init__()
        self.backbone = nn.Linear(3, 4)
        self.head = nn.Linear(4, 2)
        warnings.warn(RandomInitWarning(MESSAGE, self.backbone))


class NetTask(Task):
    """Declares NETWORK.PARTIAL_PRETRAIN as its partial-pretrain file (as the VL-BERT tasks do)."""
    name = "random_init_test"

    def build_model(self, cfg):
        return Net(cfg)

    def partial_pretrain(self, cfg):
        net = cfg.NETWORK
        return (net.PARTIAL_PRETRAIN, net.PARTIAL_PRETRAIN_PREFIX_CHANGES) if net.PARTIAL_PRETRAIN else None


TASK = NetTask()


def config(partial_pretrain=""):
    return CfgNode({"NETWORK": CfgNode({"PARTIAL_PRETRAIN": partial_pretrain, "PARTIAL_PRETRAIN_PREFIX_CHANGES": []})})


def quiet_net():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RandomInitWarning)
        return Net()


def random_init_messages(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught if issubclass(w.category, RandomInitWarning)]


def save(path, state_dict):
    model = nn.Module()
    ck.save_checkpoint(str(path), model, torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1))
    raw = ck.load_checkpoint_file(str(path))
    raw["state_dict"] = state_dict
    torch.save(raw, str(path))


def test_warned_without_pretrained_weights():
    assert random_init_messages(lambda: build_model(TASK, config(), "cpu")) == [MESSAGE]


def test_partial_pretrain_filling_the_part_drops_the_warning(tmp_path):
    source = quiet_net()
    save(tmp_path / "pretrain.model", {"module." + k: v for k, v in source.state_dict().items()})
    model = []
    assert random_init_messages(lambda: model.append(build_model(TASK, config(str(tmp_path / "pretrain.model")),
                                                                 "cpu"))) == []
    assert torch.equal(model[0].backbone.weight, source.backbone.weight)


def test_partial_pretrain_of_other_parts_keeps_the_warning(tmp_path):
    head = nn.Linear(4, 2)
    save(tmp_path / "pretrain.model", {"head." + k: v for k, v in head.state_dict().items()})
    assert random_init_messages(lambda: build_model(TASK, config(str(tmp_path / "pretrain.model")), "cpu")) == [MESSAGE]


def test_checkpoint_for_inference_drops_the_warning(tmp_path):
    trained = quiet_net()
    ck.save_checkpoint(str(tmp_path / "m-0000.model"), trained, torch.optim.SGD(trained.parameters(), lr=0.1))
    model = []
    assert random_init_messages(lambda: model.append(
        load_for_inference(TASK, config(), str(tmp_path / "m-0000.model"), "cpu"))) == []
    assert torch.equal(model[0].backbone.weight, trained.backbone.weight)


def test_held_warnings_let_other_warnings_through():
    def build():
        with held_random_init_warnings() as held:
            warnings.warn("unrelated", UserWarning)
            net = Net()
        assert [str(w) for w in held] == [MESSAGE]
        warn_random_init(net, held, loaded=["head.weight"])  # not the backbone: warned
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build()
    assert [str(w.message) for w in caught] == ["unrelated", MESSAGE]
