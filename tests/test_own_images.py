"""The own-images walkthrough (data/PREPARE_DATA.md, "Your own photos and questions") on the
scikit-image photographs: steps 1-2 through the real scripts (fast), then the whole chain through
demo/run_demo_own_images.sh at tiny size (slow)."""
import glob
import json
import os
import runpy
import subprocess

import numpy as np
import pytest
import torch

from common.errors import UserInputError
from pretrain.task import TASK as PRETRAIN_TASK
from tests.pretrain_fixtures import tokenizer
from tests.test_vqa_features import load_script
from tests.tiny_vcr import HIDDEN, SPECIAL_TOKENS, _bert_folder
from vqa.data.vqa import FEATURE_FOLDERS, PRECOMPUTED_ROOT, VQADataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_SIDE = 96  # the example's photographs shrunk: a random ResNet-50 encodes them in seconds


def example(folder):
    """(photos folder, QA JSON) of demo/own_images_example.py, photos shrunk."""
    load_script("own_images_example", "demo").make_example(str(folder), MAX_SIDE)
    return str(folder / "photos"), str(folder / "qa.json")


def test_features_and_vqa_files_read_by_the_vqa_dataset(tmp_path):
    photos, qa = example(tmp_path / "example")
    keep = ("astronaut.jpg", "coffee.jpg")  # two photographs: three questions each, one per split
    entries = [e for e in json.load(open(qa)) if e["image"] in keep]
    with open(qa, "w") as f:
        json.dump(entries, f)
    for name in os.listdir(photos):
        if name not in keep:
            os.remove(os.path.join(photos, name))
    out = str(tmp_path / "own")
    features = load_script("own_vqa_data").write_vqa_files(out, load_script("own_vqa_data").read_qa(qa, photos))
    load_script("build_vqa_answers").main(["--annotations", os.path.join(out, "vqa", "v2_mscoco_train2014_annotations"
                                                                         ".json"), "--min-count", "1", "--out",
                                           os.path.join(out, "vqa", "answers_vqa.txt")])
    runpy.run_path(os.path.join(ROOT, "bench", "smoke_paper_config.py"))["random_resnet_file"](
        str(tmp_path / "r50"), 50)
    load_script("extract_features").main(["--box-source", "grid", "--grid", "2x2", "--image-root", photos, "--out",
                                          features, "--weights", str(tmp_path / "r50-0000.model"), "--device", "cpu",
                                          "--cfg", os.path.join(ROOT, "cfgs", "vqa", "demo_cpu.yaml"),
                                          "--opts", "SCALES", "[64, 96]"])
    assert sorted(os.listdir(features)) == ["astronaut.json", "coffee.json"]
    answers = os.path.join(out, "vqa", "answers_vqa.txt")
    train = VQADataset("train2014", out, answers, tokenizer(tmp_path), boxes="36")
    assert len(train) == 2 and train.database[0]["image_id"] == "astronaut"
    image, boxes, im_info, question, label = train[0]
    assert image is None and boxes.shape == (6, 4 + 2048)  # the whole image, then the grid's whole image + 4 cells
    assert label.max() == 1.0 and len(label) == len(open(answers).read().split("\n")) - 1
    test = VQADataset("test2015", out, answers, tokenizer(tmp_path), boxes="36", test_mode=True)
    assert len(test) == 2 and test[0][1].shape == (6, 4 + 2048)


def test_qa_file_errors_name_the_entry_and_key(tmp_path):
    photos, _ = example(tmp_path / "example")
    converter = load_script("own_vqa_data")
    cases = [([{"image": "cat.jpg", "question": "why ?", "answer": "x"}], r"entry 0: 'image' cat\.jpg is not a file"),
             ([{"image": "coffee.jpg", "question": "why ?"}], r"entry 0: a train question needs 'answer'"),
             ([{"image": "coffee.jpg", "question": "why ?", "answer": "x", "split": "dev"}],
              r"entry 0: 'split' must be one of train, val, test, got 'dev'"),
             ([{"image": "coffee.jpg", "question": "why ?", "answer": "x"}], r"qa\.json: no val or test question")]
    for entries, message in cases:
        (tmp_path / "qa.json").write_text(json.dumps(entries))
        with pytest.raises(UserInputError, match=message):
            converter.read_qa(str(tmp_path / "qa.json"), photos)


def tiny_pretraining_checkpoint(path, bert):
    """A pretraining model's weights (random) of the tiny size, saved as a checkpoint."""
    cfg = PRETRAIN_TASK.load_config(os.path.join(ROOT, "cfgs", "pretrain", "demo_e2e_cpu.yaml"), [
        "NETWORK.BERT_MODEL_NAME", bert, "NETWORK.IMAGE_FINAL_DIM", str(HIDDEN), "NETWORK.VLBERT.hidden_size",
        str(HIDDEN), "NETWORK.VLBERT.visual_size", str(HIDDEN), "NETWORK.VLBERT.num_hidden_layers", "2",
        "NETWORK.VLBERT.num_attention_heads", "2", "NETWORK.VLBERT.intermediate_size", "64",
        "NETWORK.VLBERT.vocab_size", str(len(open(os.path.join(bert, "vocab.txt")).read().split())),
        "NETWORK.VLBERT.max_position_embeddings", "128", "NETWORK.VLBERT.word_embedding_frozen", "false"])
    torch.save({"state_dict": PRETRAIN_TASK.build_model(cfg).state_dict()}, path)


@pytest.mark.slow
def test_the_whole_chain_from_photos_to_predictions(tmp_path):
    photos, qa = example(tmp_path / "example")
    words = {w for e in json.load(open(qa)) for w in e["question"].split()}
    bert = str(tmp_path / "bert")
    _bert_folder(bert, SPECIAL_TOKENS + sorted(words))
    tiny_pretraining_checkpoint(str(tmp_path / "pretrained.model"), bert)
    out = str(tmp_path / "own")
    env = dict(os.environ, OUT=out, NPROC="1", GRID="2x2", PRETRAINED=str(tmp_path / "pretrained.model"),
               CUDA_VISIBLE_DEVICES="")
    tiny = {"SCALES": "[64, 96]", "NETWORK.BERT_MODEL_NAME": bert, "NETWORK.IMAGE_FINAL_DIM": HIDDEN,
            "NETWORK.VLBERT.hidden_size": HIDDEN, "NETWORK.VLBERT.visual_size": HIDDEN,
            "NETWORK.VLBERT.num_hidden_layers": 2, "NETWORK.VLBERT.num_attention_heads": 2,
            "NETWORK.VLBERT.intermediate_size": 64, "NETWORK.VLBERT.max_position_embeddings": 128,
            "NETWORK.VLBERT.word_embedding_frozen": "false",
            "NETWORK.VLBERT.vocab_size": len(SPECIAL_TOKENS) + len(words), "TRAIN.END_EPOCH": 1,
            "TRAIN.BATCH_IMAGES": 4, "TRAIN.WARMUP_STEPS": 1, "VAL.BATCH_IMAGES": 4, "TEST.BATCH_IMAGES": 4}
    opts = [str(x) for kv in tiny.items() for x in kv]
    result = subprocess.run(["bash", os.path.join(ROOT, "demo", "run_demo_own_images.sh"), photos, qa] + opts,
                            env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = os.path.join(out, "output", "vl-bert", "vqa", "demo_cpu", "train2014_train")
    log = open(glob.glob(os.path.join(run, "*.log"))[0]).read()
    assert "[Partial Load] {}".format(tmp_path / "pretrained.model") in log
    predictions = json.load(open(os.path.join(run, "test_result", "own_vqa2_test2015.json")))
    test_ids = [i + 1 for i, e in enumerate(json.load(open(qa))) if e["split"] == "test"]
    assert sorted(p["question_id"] for p in predictions) == test_ids
    assert "Own-images VQA done." in result.stdout
    # Step 5: attention maps of the fine-tuned checkpoint, its VL-BERT and obj_downsample loaded, the ResNet from
    # the step-1 file (no random-init warning), one .npy per photo whose rows are distributions, and the PNGs.
    ckpt = glob.glob(os.path.join(run, "*-best.model"))[0]
    loaded = next(line for line in result.stdout.splitlines() if line.startswith(ckpt + ": loaded"))
    assert "vlbert.* " in loaded and "image_feature_extractor.* 2" in loaded, loaded
    assert "RandomInitWarning" not in result.stderr and "keeps its random" not in result.stderr
    attention = os.path.join(run, "attention")
    photo_ids = sorted({os.path.splitext(e["image"])[0] for e in json.load(open(qa))})
    probs_dir = os.path.join(attention, "attention_probs")
    assert sorted(n[:-4] for n in os.listdir(probs_dir) if n.endswith(".npy")) == photo_ids
    for photo in photo_ids:
        probs = np.load(os.path.join(probs_dir, photo + ".npy"))
        record = json.load(open(os.path.join(probs_dir, photo + ".json")))
        features = json.load(open(os.path.join(out, PRECOMPUTED_ROOT, FEATURE_FOLDERS["36"][0], photo + ".json")))
        num_tokens = len(record["tokens"])
        assert probs.shape == (2, 2, num_tokens, num_tokens)
        np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-4)
        assert record["regions"][1] - record["regions"][0] == features["num_boxes"] + 1  # + the whole image
        assert glob.glob(os.path.join(attention, "maps", photo, "*.png"))
    assert "attention maps of {} item(s); 0 skipped".format(len(photo_ids)) in result.stdout


def test_a_folder_of_other_photos_is_refused_before_any_work(tmp_path):
    """demo/run_demo_own_images.sh into an OUT written for other photos and questions (the example's, here):
    one error naming the folder and the OUT to give, exit code 2, nothing written (the other run's
    checkpoint would not fit: another answer vocabulary)."""
    photos, qa = tmp_path / "photos", tmp_path / "qa.json"  # never read: the refusal comes first
    photos.mkdir()
    qa.write_text("[]")
    out = tmp_path / "own"
    out.mkdir()
    inputs = "{}\n{}\n".format(out / "example" / "photos", out / "example" / "qa.json")
    (out / ".inputs").write_text(inputs)
    result = subprocess.run(["bash", os.path.join(ROOT, "demo", "run_demo_own_images.sh"), str(photos), str(qa)],
                            env=dict(os.environ, OUT=str(out)), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr == ("error: OUT '{0}' holds the data and run of other photos and questions ({0}/example/photos "
                             "{0}/example/qa.json): move that folder away, or give this data set its own, e.g. "
                             "OUT={0}_2\n".format(out))
    assert os.listdir(out) == [".inputs"] and (out / ".inputs").read_text() == inputs
