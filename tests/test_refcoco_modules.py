"""RefCOCO+ model: the reference's state-dict keys and shapes, the forward contract, loss, predicted boxes."""
import json
import os

import pytest
import torch
import torch.nn.functional as F

from common.data.build import build_dataset, make_dataloader
import refcoco.data  # noqa: F401  (registers the 'refcoco+' dataset)
from refcoco.task import TASK as REFCOCO_TASK
from refcoco.metrics import RefAccuracy, grounding_correct
from refcoco.modules import MODELS
from refcoco.modules.resnet_vlbert_for_refcoco import PADDED_LOGIT, pack_expression
from tests.refcoco_fixture import write_refcoco
from tests.test_modules import NO_WEIGHTS, TINY

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFGS = os.path.join(ROOT, "cfgs", "refcoco")

pytestmark = pytest.mark.filterwarnings("ignore:NETWORK.*(BERT_MODEL_NAME|IMAGE_PRETRAINED) is empty")


def build(opts, cfg_file="base_gt_boxes_4x16G.yaml"):
    torch.manual_seed(0)
    return MODELS.build(REFCOCO_TASK.load_config(os.path.join(CFGS, cfg_file), opts))


def test_base_state_dict_equals_reference():
    with open(os.path.join(ROOT, "tests", "data", "refcoco_base_state_dict_shapes.json")) as f:
        expected = json.load(f)
    model = build(NO_WEIGHTS)
    assert {k: list(v.shape) for k, v in model.state_dict().items()} == expected["cfgs/refcoco/base_gt_boxes_4x16G.yaml"]
    assert sum(p.numel() for p in model.parameters()) == expected["num_parameters"] == 155135041


def test_all_paper_configs_build_the_same_network_per_size():
    def network(name):
        return REFCOCO_TASK.load_config(os.path.join(CFGS, name)).NETWORK
    assert network("base_gt_boxes_4x16G.yaml") == network("base_detected_regions_4x16G.yaml")
    assert network("large_gt_boxes_4x16G.yaml") == network("large_detected_regions_4x16G.yaml")


def test_config_errors_and_warnings():
    with pytest.raises(ValueError, match="object_word_embed_mode 2 .* got 1"):
        build(TINY + ["NETWORK.VLBERT.object_word_embed_mode", 1])
    with pytest.warns(UserWarning, match="ENABLE_CNN_REG_LOSS is ignored"):
        build(TINY + ["NETWORK.ENABLE_CNN_REG_LOSS", True])


def test_pack_expression():
    ids, mask = pack_expression(torch.tensor([[5, 6, 0], [7, 0, 0], [0, 0, 0]]), 101, 102)
    assert ids.tolist() == [[101, 5, 6, 102, 0], [101, 7, 102, 0, 0], [101, 102, 0, 0, 0]]
    assert mask.tolist() == [[True] * 4 + [False], [True] * 3 + [False] * 2, [True] * 2 + [False] * 3]


def synthetic_batch():
    """Two 64x80 images; item 1 has 2 of 3 boxes and a shorter expression (padding as the common collate)."""
    g = torch.Generator().manual_seed(0)
    image = torch.randn(2, 3, 64, 80, generator=g)
    boxes = torch.tensor([[[0, 0, 79, 63], [10, 10, 40, 30], [40, 20, 70, 60]],
                          [[0, 0, 79, 63], [5, 5, 30, 50], [-1, -1, -1, -1]]], dtype=torch.float32)
    im_info = torch.tensor([[80, 64, 2, 2, 7], [80, 64, 0.5, 0.25, 3]], dtype=torch.float32)
    expression = torch.tensor([[120, 130, 140], [150, 160, 0]])
    label = torch.tensor([[0, 1, 0], [0, 1, 0]], dtype=torch.float32)
    return image, boxes, im_info, expression, label


def test_train_forward_loss_is_bce_over_valid_boxes():
    model = build(TINY).train()
    outputs, loss = model(*synthetic_batch())
    assert set(outputs) == {"label_logits", "label", "cls_loss"}
    logits = outputs["label_logits"].detach()
    assert logits.shape == (2, 3) and logits[1, 2] == PADDED_LOGIT
    assert outputs["label"].tolist() == [[0, 1, 0], [0, 1, -1]]
    valid = torch.tensor([[True, True, True], [True, True, False]])
    expected = F.binary_cross_entropy_with_logits(logits[valid], torch.tensor([0., 1, 0, 0, 1]))
    assert torch.allclose(loss.detach(), expected) and loss is outputs["cls_loss"]
    loss.backward()
    assert model.final_mlp[2].weight.grad.abs().sum() > 0


def test_inference_predicts_the_argmax_box_in_original_pixels():
    model = build(TINY).eval()
    image, boxes, im_info, expression, _ = synthetic_batch()
    with torch.no_grad():
        outputs = model(image, boxes, im_info, expression)
    assert set(outputs) == {"label_logits", "pred_boxes", "index"}
    assert outputs["index"].tolist() == [7, 3]
    choice = outputs["label_logits"].argmax(1)
    assert choice[1] < 2  # never the padded slot
    expected = torch.stack([boxes[0, choice[0]] / 2, boxes[1, choice[1]] / torch.tensor([0.5, 0.25, 0.5, 0.25])])
    assert torch.equal(outputs["pred_boxes"], expected)
    # reference-style im_info with 4 columns: no index
    with torch.no_grad():
        assert "index" not in model(image, boxes, im_info[:, :4], expression)


def test_padding_does_not_change_the_scores_of_an_item():
    model = build(TINY).eval()
    image, boxes, im_info, expression, _ = synthetic_batch()
    with torch.no_grad():
        together = model(image, boxes, im_info, expression)["label_logits"]
        alone = model(image[1:], boxes[1:, :2], im_info[1:], expression[1:, :2])["label_logits"]
    assert torch.allclose(together[1, :2], alone[0], atol=1e-5)


def test_fixture_data_through_loader_model_and_accuracy(tmp_path):
    root = write_refcoco(str(tmp_path))
    opts = ["DATASET.DATASET_PATH", root, "NUM_WORKERS_PER_GPU", 0, "SCALES", [60, 100], "VAL.BATCH_IMAGES", 2,
            "DATASET.VAL_IMAGE_SET", "train+val+test", "DATASET.VAL_BOXES", "proposal+gt"]
    cfg = REFCOCO_TASK.load_config(os.path.join(CFGS, "base_detected_regions_4x16G.yaml"), TINY + opts)
    # The model is randomly initialised (no BERT folder); the data set reads the fixture's vocabulary.
    data_cfg = REFCOCO_TASK.load_config(os.path.join(CFGS, "base_detected_regions_4x16G.yaml"),
                           opts + ["NETWORK.BERT_MODEL_NAME", os.path.join(root, "bert")])
    dataset = build_dataset(data_cfg, "val")
    loader = make_dataloader(cfg, "val", dataset=dataset)
    model = MODELS.build(cfg).eval()
    metric = RefAccuracy(dataset.referred_boxes, allreduce=False)
    correct = []
    with torch.no_grad():
        for image, boxes, im_info, expression, label in loader:
            outputs = model(image, boxes, im_info, expression)
            metric.update(outputs)
            correct += grounding_correct(outputs["pred_boxes"], dataset.referred_boxes[outputs["index"]]).tolist()
            # every prediction is one of the item's candidates (or the image box), in original image pixels
            for pred, index in zip(outputs["pred_boxes"], outputs["index"].tolist()):
                item = dataset.items[index]
                image_box = torch.tensor([[0.0, 0.0, item["width"] - 1, item["height"] - 1]])
                candidates = torch.cat([image_box, dataset.candidate_boxes(index)])
                assert torch.isclose(candidates, pred, atol=1e-4).all(1).any()
    assert len(correct) == len(dataset) == 5
    assert metric.get()[1] == pytest.approx(sum(correct) / 5)


def test_blind_model_scores_boxes_without_their_pixels():
    """NETWORK.BLIND: the scores depend on the boxes and the words, not on the image's content."""
    image, boxes, im_info, expression, _ = synthetic_batch()
    other = torch.randn(image.shape, generator=torch.Generator().manual_seed(5))
    # visual features at full weight (the paper configs start them at 0)
    seen = TINY + ["NETWORK.VLBERT.visual_scale_text_init", 1.0, "NETWORK.VLBERT.visual_scale_object_init", 1.0]
    with torch.no_grad():
        blind = build(seen + ["NETWORK.BLIND", True]).eval()
        assert torch.equal(blind(image, boxes, im_info, expression)["label_logits"],
                           blind(other, boxes, im_info, expression)["label_logits"])
        moved = boxes.clone()
        moved[0, 1] += 5
        assert not torch.equal(blind(image, boxes, im_info, expression)["label_logits"][0],
                               blind(image, moved, im_info, expression)["label_logits"][0])
        seeing = build(seen).eval()
        assert not torch.equal(seeing(image, boxes, im_info, expression)["label_logits"],
                               seeing(other, boxes, im_info, expression)["label_logits"])
