"""Fast R-CNN image encoder: reference keys, RoI features by hand, clipping, padding, precision, weights."""
import json
import math
import os

import pytest
import torch
import torch.nn.functional as F
from torchvision.models import resnet as tv_resnet

from common.modeling.backbone import FrozenBatchNorm2d
from common.modeling.fast_rcnn import FastRCNN, coordinate_embeddings
from tests.conftest import LEGACY
from vcr.task import TASK as VCR_TASK

torch.set_num_threads(1)

VCR_BASE = "cfgs/vcr/base_q2a_4x16G_fp32.yaml"


def make_config(**network):
    """VCR defaults with a small, fast image encoder (ResNet-18, dilated C5) unless overridden."""
    values = dict(IMAGE_NUM_LAYERS=18, IMAGE_C5_DILATED=True, IMAGE_STRIDE_IN_1x1=True, IMAGE_PRETRAINED="",
                  IMAGE_FROZEN_BACKBONE_STAGES=[1, 2], IMAGE_FROZEN_BN=True, IMAGE_SEMANTIC=False,
                  IMAGE_FEAT_PRECOMPUTED=False)
    values.update(network)
    opts = []
    for key, value in values.items():
        opts += [f"NETWORK.{key}", value]
    return VCR_TASK.load_config(None, opts)


def make_model(final_dim=32, enable_cnn_reg_loss=False, **network):
    torch.manual_seed(0)
    model = FastRCNN(make_config(**network), final_dim=final_dim, enable_cnn_reg_loss=enable_cnn_reg_loss)
    return model.eval()


def batch():
    """Two images padded to 64x96 (the second is 40 wide, 30 high) with 3 box slots each."""
    g = torch.Generator().manual_seed(1)
    images = torch.randn(2, 3, 64, 96, generator=g)
    images[1, :, 30:] = 0
    images[1, :, :, 40:] = 0
    boxes = torch.tensor([[[4.0, 6.0, 50.0, 40.0], [20.0, 2.0, 90.0, 60.0], [0.0, 0.0, 0.0, 0.0]],
                          [[3.0, 5.0, 30.0, 25.0], [-2.0, -2.0, -2.0, -2.0], [-2.0, -2.0, -2.0, -2.0]]])
    box_mask = torch.tensor([[True, True, True], [True, False, False]])
    im_info = torch.tensor([[96.0, 64.0, 1.0, 1.0], [40.0, 30.0, 1.0, 1.0]])
    return images, boxes, box_mask, im_info


def roi_align_by_hand(feature, box, scale, size=14):
    """Legacy RoI Align (no half-pixel offset, one bilinear sample at each bin centre).

    ``feature`` [C, H, W], ``box`` (x1, y1, x2, y2) in image pixels -> [C, size, size].
    Written from the definition in He et al., "Mask R-CNN" (ICCV 2017) with maskrcnn-benchmark's
    boundary rules, independent of torchvision.
    """
    _, height, width = feature.shape
    x1, y1, x2, y2 = (float(v) * scale for v in box)
    bin_w = max(x2 - x1, 1.0) / size
    bin_h = max(y2 - y1, 1.0) / size
    out = torch.zeros(feature.shape[0], size, size, dtype=torch.float64)
    f = feature.double()
    for i in range(size):
        for j in range(size):
            y = y1 + (i + 0.5) * bin_h
            x = x1 + (j + 0.5) * bin_w
            if y < -1 or y > height or x < -1 or x > width:
                continue
            y, x = max(y, 0.0), max(x, 0.0)
            y0, x0 = min(int(y), height - 1), min(int(x), width - 1)
            y1_, x1_ = min(y0 + 1, height - 1), min(x0 + 1, width - 1)
            y = float(y0) if y0 == height - 1 else y
            x = float(x0) if x0 == width - 1 else x
            ly, lx = y - y0, x - x0
            out[:, i, j] = ((1 - ly) * (1 - lx) * f[:, y0, x0] + (1 - ly) * lx * f[:, y0, x1_]
                            + ly * (1 - lx) * f[:, y1_, x0] + ly * lx * f[:, y1_, x1_])
    return out.float()


def test_vcr_base_keys_and_shapes():
    """ResNet-101, stride in 1x1, dilated C5, final dim 768: the reference's image_feature_extractor.* tensors."""
    with open(os.path.join(LEGACY, "vcr_base_state_dict_shapes.json")) as f:
        reference = json.load(f)[VCR_BASE]
    prefix = "image_feature_extractor."
    expected = {k[len(prefix):]: v for k, v in reference.items() if k.startswith(prefix)}
    cfg = VCR_TASK.load_config(os.path.join(LEGACY, VCR_BASE), ["NETWORK.IMAGE_PRETRAINED", ""])
    net = cfg.NETWORK
    model = FastRCNN(cfg, average_pool=True, final_dim=net.IMAGE_FINAL_DIM,
                     enable_cnn_reg_loss=net.ENABLE_CNN_REG_LOSS and not net.CNN_LOSS_TOP)
    ours = {k: list(v.shape) for k, v in model.state_dict().items()}
    assert ours == expected
    # Frozen BN keeps weight / bias as parameters: the count equals the reference's (head.0 is res5 again).
    buffers = ("running_mean", "running_var", "num_batches_tracked")
    count = sum(math.prod(v) for k, v in expected.items() if not k.endswith(buffers) and not k.startswith("head."))
    assert sum(p.numel() for p in model.parameters()) == count
    # res5 is one module seen under two names, as in the reference.
    assert model.head[0] is model.roi_head_feature_extractor


def test_roi_features_equal_hand_roi_align():
    model = make_model()
    images, boxes, box_mask, im_info = batch()
    with torch.no_grad():
        out = model(images, boxes, box_mask, im_info)
        c4 = model.backbone(images)
        for b, n in [(0, 0), (0, 1), (1, 0)]:
            crop = roi_align_by_hand(c4[b], boxes[b, n], 1 / 16)
            raw = model.roi_head_feature_extractor(crop[None]).mean((2, 3))[0]
            torch.testing.assert_close(out["obj_reps_raw"][b, n], raw, rtol=1e-4, atol=1e-5)
            coords = boxes[b, n][None]
            embed = coordinate_embeddings(coords, im_info[b, None, :2])
            linear = model.obj_downsample[1]
            expected = F.relu(F.linear(torch.cat((embed, raw[None]), 1), linear.weight, linear.bias))[0]
            torch.testing.assert_close(out["obj_reps"][b, n], expected, rtol=1e-4, atol=1e-5)


def test_coordinate_embeddings_values():
    box = torch.tensor([[10.0, 20.0, 110.0, 70.0]])
    size = torch.tensor([[200.0, 100.0]])
    embed = coordinate_embeddings(box, size, dim=256)
    assert embed.shape == (1, 2048)
    pos = [30.0, 45.0, 50.0, 50.0]  # centre and size in percent of the image
    for c, p in enumerate(pos):
        for i in (0, 1, 100, 255):
            angle = p / 1000 ** (i / 256)
            assert embed[0, c * 512 + i].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert embed[0, c * 512 + 256 + i].item() == pytest.approx(math.cos(angle), abs=1e-5)


def test_boxes_clipped_to_their_own_image():
    """A box beyond the second image (40x30) but inside the padded batch equals the clipped box."""
    model = make_model()
    images, boxes, box_mask, im_info = batch()
    outside = boxes.clone()
    outside[1, 0] = torch.tensor([-15.0, -8.0, 90.0, 60.0])
    outside[0, 1] = torch.tensor([20.0, 2.0, 500.0, 300.0])
    clipped = boxes.clone()
    clipped[1, 0] = torch.tensor([0.0, 0.0, 39.0, 29.0])
    clipped[0, 1] = torch.tensor([20.0, 2.0, 95.0, 63.0])
    with torch.no_grad():
        a = model(images, outside, box_mask, im_info)
        b = model(images, clipped, box_mask, im_info)
    for key in ("obj_reps_raw", "obj_reps"):
        torch.testing.assert_close(a[key], b[key])


def test_zero_and_padded_boxes():
    """All-zero boxes are valid and finite; masked slots are exact zeros; gradients are finite."""
    model = make_model(IMAGE_FROZEN_BACKBONE_STAGES=[]).train()
    images, boxes, box_mask, im_info = batch()
    boxes[1, 0] = 0
    out = model(images, boxes, box_mask, im_info)
    assert all(torch.isfinite(v).all() for v in out.values())
    assert torch.equal(out["obj_reps"][~box_mask], torch.zeros(2, 32))
    assert torch.equal(out["obj_reps_raw"][~box_mask], torch.zeros(2, 512))
    assert out["obj_reps_raw"][0, 2].abs().sum() > 0  # the zero box at (0, 2) is a real box
    (out["obj_reps"].sum() + out["obj_reps_raw"].sum()).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_no_valid_box_at_all():
    model = make_model(IMAGE_SEMANTIC=True)
    images, boxes, _, im_info = batch()
    classes = torch.zeros(2, 3, dtype=torch.long)
    with torch.no_grad():
        out = model(images, boxes, torch.zeros(2, 3, dtype=torch.bool), im_info, classes=classes)
    assert torch.equal(out["obj_reps"], torch.zeros(2, 3, 32))


def test_cnn_regularization_and_semantic_embedding():
    model = make_model(enable_cnn_reg_loss=True, IMAGE_SEMANTIC=True)
    assert model.obj_downsample[1].in_features == 2048 + 512 + 128
    images, boxes, box_mask, im_info = batch()
    classes = torch.tensor([[3, 7, 80], [1, 0, 0]])
    with torch.no_grad():
        out = model(images, boxes, box_mask, im_info, classes=classes)
        raw = out["obj_reps_raw"][box_mask]
        logits = model.regularizing_predictor(raw)
    labels = torch.tensor([3, 7, 80, 1])
    assert torch.equal(out["obj_labels"], labels)
    torch.testing.assert_close(out["obj_logits"], logits)
    torch.testing.assert_close(out["cnn_regularization_loss"], F.cross_entropy(logits, labels)[None])
    with pytest.raises(ValueError, match="classes"):
        model(images, boxes, box_mask, im_info)


def test_segms_multiply_res5_output():
    model = make_model()
    images, boxes, box_mask, im_info = batch()
    with torch.no_grad():
        plain = model(images, boxes, box_mask, im_info)
        ones = model(images, boxes, box_mask, im_info, segms=torch.ones(2, 3, 14, 14))
        zeros = model(images, boxes, box_mask, im_info, segms=torch.zeros(2, 3, 14, 14))
    torch.testing.assert_close(ones["obj_reps"], plain["obj_reps"])
    assert torch.equal(zeros["obj_reps_raw"], torch.zeros(2, 3, 512))


def test_mvrc_masked_visual_embedding():
    model = make_model()
    images, boxes, box_mask, im_info = batch()
    mvrc_ops = torch.tensor([[0, 1, 0], [0, 0, 0]])
    embed = torch.randn(512)
    with torch.no_grad():
        plain = model(images, boxes, box_mask, im_info)
        masked = model(images, boxes, box_mask, im_info, mvrc_ops=mvrc_ops, mask_visual_embed=embed)
        coords = coordinate_embeddings(boxes[0, 1, None], im_info[0, None, :2])
        expected = model.obj_downsample(torch.cat((coords, embed[None]), 1))[0]
    torch.testing.assert_close(masked["obj_reps"][0, 1], expected)
    keep = torch.tensor([[True, False, True], [True, True, True]])
    torch.testing.assert_close(masked["obj_reps"][keep], plain["obj_reps"][keep])


def test_precomputed_features():
    model = make_model(IMAGE_FEAT_PRECOMPUTED=True, IMAGE_SEMANTIC=True)
    assert not any(k.startswith(("backbone.", "head.", "roi_head")) for k in model.state_dict())
    _, boxes, box_mask, im_info = batch()
    feats = torch.rand(2, 3, 2048)
    classes = torch.tensor([[1, 2, 3], [4, 0, 0]])
    with torch.no_grad():
        out = model(None, torch.cat((boxes, feats), -1), box_mask, im_info, classes=classes)
        coords = coordinate_embeddings(boxes[0, :1], im_info[:1, :2])
        visual = torch.cat((feats[0, :1], model.object_embed(classes[0, :1])), 1)
        expected = model.obj_downsample(torch.cat((coords, visual), 1))[0]
    assert torch.equal(out["obj_reps_raw"][box_mask], feats[box_mask])
    assert torch.equal(out["obj_reps_raw"][~box_mask], torch.zeros(2, 2048))
    torch.testing.assert_close(out["obj_reps"][0, 0], expected)
    with pytest.raises(ValueError, match=r"4 \+ 2048"):
        model(None, torch.cat((boxes, feats[..., :100]), -1), box_mask, im_info, classes=classes)


def test_frozen_stages_and_bn_through_training_step():
    """VCR setting: stem and res2 frozen, frozen BN everywhere; a train-mode SGD step leaves them as they were."""
    model = make_model(IMAGE_FROZEN_BACKBONE_STAGES=[1, 2]).train()
    assert all(isinstance(m, FrozenBatchNorm2d) for m in model.modules() if "BatchNorm" in type(m).__name__)
    frozen = ("backbone.conv1.", "backbone.bn1.", "backbone.layer1.")
    named = dict(model.named_parameters(remove_duplicate=False))
    for name, p in named.items():
        is_bn = ".bn" in name or ".downsample.1." in name
        assert p.requires_grad == (not name.startswith(frozen) and not is_bn), name
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    images, boxes, box_mask, im_info = batch()
    model(images, boxes, box_mask, im_info)["obj_reps"].square().sum().backward()
    optimizer.step()
    after = model.state_dict()
    for k, v in before.items():
        trained = k in named and named[k].requires_grad
        assert torch.equal(v, after[k]) != trained, k


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_finite_with_tiny_running_var(dtype):
    """Tiny running variances (weights scaled to keep activations sane) stay finite under autocast."""
    model = make_model(IMAGE_C5_DILATED=False)  # 7x7 res5: CPU float16 convolutions are slow
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, FrozenBatchNorm2d):
                m.running_var.fill_(1e-12)
                m.weight.fill_(math.sqrt(1e-5) * 0.5)
    images, boxes, box_mask, im_info = batch()
    with torch.no_grad():
        expected = model(images, boxes, box_mask, im_info)
        with torch.autocast("cpu", dtype=dtype):
            out = model(images, boxes, box_mask, im_info)
    for key in ("obj_reps_raw", "obj_reps"):
        assert torch.isfinite(out[key]).all()
        torch.testing.assert_close(out[key].float(), expected[key], rtol=0.1, atol=0.05)


def test_pretrained_round_trip(tmp_path):
    """A whole-ResNet file in the reference layout ({path}-{epoch:04d}.model) fills trunk and res5."""
    g = torch.Generator().manual_seed(4)
    state = {k: (torch.randn(v.shape, generator=g) if v.is_floating_point() else v)
             for k, v in tv_resnet.resnet18().state_dict().items()}
    prefix = str(tmp_path / "resnet18-test")
    torch.save(state, f"{prefix}-0007.model")
    model = make_model(IMAGE_PRETRAINED=prefix, IMAGE_PRETRAINED_EPOCH=7)
    model.init_weight()
    loaded = model.state_dict()
    for k, v in state.items():
        if k.startswith("fc."):
            continue
        ours = "roi_head_feature_extractor." + k[len("layer4."):] if k.startswith("layer4.") else "backbone." + k
        assert torch.equal(loaded[ours], v), k
    assert torch.equal(loaded["head.0.0.conv1.weight"], state["layer4.0.conv1.weight"])


def test_pretrained_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nowhere/resnet-0000\.model"):
        make_model(IMAGE_PRETRAINED=str(tmp_path / "nowhere" / "resnet"))
    torch.save({"conv1.weight": torch.zeros(64, 3, 7, 7)}, tmp_path / "partial-0000.model")
    model = make_model(IMAGE_PRETRAINED=str(tmp_path / "partial"))
    with pytest.raises(ValueError, match=r"partial-0000\.model: .*missing"):
        model.init_weight()
    with pytest.warns(UserWarning, match="IMAGE_PRETRAINED is empty"):
        make_model().init_weight()


def test_bad_settings():
    with pytest.raises(ValueError, match="IMAGE_NUM_LAYERS"):
        make_model(IMAGE_NUM_LAYERS=42)
    with pytest.raises(NotImplementedError, match="OUTPUT_CONV5"):
        make_model(OUTPUT_CONV5=True)
    with pytest.raises(ValueError, match="average_pool"):
        FastRCNN(make_config(), average_pool=False)
