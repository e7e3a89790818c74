"""Write a small VCR-format data set for the demo and the tests (deterministic, ~10 s).

Two parts share one layout (that of VCR, see data/PREPARE_DATA.md):

- real: 11 photographs shipped inside scikit-image (``skimage.data``, no download), each with
  hand-placed boxes and 3 hand-written question / 4 answers / 4 rationales items that refer to
  the boxes. annot_id ``real-<split>-<n>``; per photo, item 0 goes to train, 1 to val, 2 to test.
- shapes (learnable): generated 96x96 scenes of four coloured shapes; the questions ask for the
  left/right/top/bottom-most object and the four answers are the four objects, so the answer
  texts carry no hint: a text-only model stays at chance (25%). The objects are named "shape"
  (not "person", whose references become distinct first names: one more text difference between
  the candidates to unlearn). annot_id ``shapes-<split>-<n>``.

Output (``--out``, default data/demo):

    train.jsonl      shapes + real training items
    val.jsonl        shapes + real validation items
    val_shapes.jsonl validation items of the learnable part only (for its accuracy)
    val_real.jsonl   validation items on the photographs only
    test.jsonl       shapes + real test items, without labels
    vcr1images/      shapes/<split>_<n>.{jpg,json}, real/<name>.{jpg,json}
    vcr1images.zip   the same folder as a zip (``--zip``; for DATASET.ZIP_MODE)

Usage: python demo/make_demo_data.py [--out data/demo] [--seed 0] [--train 3000] [--val 500]
       [--test 200] [--zip]
The VQA-format demo is demo/make_vqa_demo_data.py.
"""
import argparse
import json
import os
import re
import zipfile

import numpy as np
from PIL import Image, ImageDraw

COLORS = {"red": (215, 40, 40), "green": (40, 170, 60), "blue": (45, 80, 215), "yellow": (230, 205, 35)}
SHAPES = ("circle", "square", "triangle", "cross")
SCENE_SIZE = 96
SLOTS = (14, 37, 60, 83)  # centre coordinates: four columns and four rows, 23 px apart
HALF = 9                   # half the side of a shape, px (shapes never overlap)
QUESTIONS_PER_SCENE = 2
SPLITS = ("train", "val", "test")


# ------------------------------------------------------------------------ text helpers
def tokens(text):
    """``"Why is [0,2] here ?"`` -> ``["Why", "is", [0, 2], "here", "?"]`` (VCR tokens)."""
    out = []
    for t in text.split():
        m = re.fullmatch(r"\[(\d+(?:,\d+)*)\]", t)
        out.append([int(i) for i in m.group(1).split(",")] if m else t)
    return out


def annotation(annot_id, img_fn, objects, question, answers, rationales, a_label, r_label, test):
    """One VCR jsonl record; answers/rationales are token lists already in final order."""
    ann = {"annot_id": annot_id, "movie": img_fn.split("/")[0], "img_fn": img_fn,
           "metadata_fn": img_fn.rsplit(".", 1)[0] + ".json", "objects": objects,
           "question": question, "answer_choices": answers, "rationale_choices": rationales}
    if not test:
        ann["answer_label"] = a_label
        ann["rationale_label"] = r_label
    return ann


# ------------------------------------------------------------------------ shapes part
def shape_polygon(kind, cx, cy, h=HALF):
    """Outline of a shape centred at (cx, cy) as a list of [x, y] (pixels)."""
    if kind == "circle":
        a = np.linspace(0, 2 * np.pi, 16, endpoint=False)
        return [[float(cx + h * np.cos(t)), float(cy + h * np.sin(t))] for t in a]
    if kind == "square":
        return [[cx - h, cy - h], [cx + h, cy - h], [cx + h, cy + h], [cx - h, cy + h]]
    if kind == "triangle":
        return [[cx, cy - h], [cx + h, cy + h], [cx - h, cy + h]]
    t = h // 3  # cross: a plus sign of arm width 2t
    return [[cx - t, cy - h], [cx + t, cy - h], [cx + t, cy - t], [cx + h, cy - t], [cx + h, cy + t],
            [cx + t, cy + t], [cx + t, cy + h], [cx - t, cy + h], [cx - t, cy + t], [cx - h, cy + t],
            [cx - h, cy - t], [cx - t, cy - t]]


def make_scene(rng, colors=None):
    """Four objects: a permutation of the colours, of the shapes, of the columns and of the rows.

    Args:
        rng: ``numpy.random.RandomState``.
        colors: colour name of each object (4 names of ``COLORS``, repeats allowed); None draws a
            permutation of the four colours (the VCR demo's scenes).
    Returns:
        (image, objects): ``PIL.Image`` RGB and a list of dicts with color, shape, cx, cy, box,
        polygon; the list order is random and is the object index order of the annotations.
    """
    base = rng.randint(150, 235)
    noise = rng.randint(-12, 13, size=(SCENE_SIZE, SCENE_SIZE, 1))
    canvas = np.clip(base + noise + rng.randint(-10, 11, size=3), 0, 255).astype(np.uint8)
    image = Image.fromarray(canvas)
    draw = ImageDraw.Draw(image)
    colors = rng.permutation(list(COLORS)) if colors is None else colors
    shapes = rng.permutation(SHAPES)
    cols, rows = rng.permutation(4), rng.permutation(4)
    objects = []
    for k in range(4):
        cx = SLOTS[cols[k]] + rng.randint(-2, 3)
        cy = SLOTS[rows[k]] + rng.randint(-2, 3)
        poly = shape_polygon(shapes[k], cx, cy)
        draw.polygon([tuple(p) for p in poly], fill=COLORS[colors[k]])
        objects.append({"color": str(colors[k]), "shape": str(shapes[k]), "cx": cx, "cy": cy,
                        "box": [cx - HALF, cy - HALF, cx + HALF, cy + HALF], "polygon": poly})
    return image, objects


# kind -> (coordinate, sign): the answer is the object whose coordinate times sign is largest
EXTREMES = {"leftmost": ("cx", -1), "rightmost": ("cx", 1), "topmost": ("cy", -1), "bottommost": ("cy", 1)}
KINDS = tuple(EXTREMES)
# Not "person": VCR turns each person reference into a different first name, a text difference between
# the candidates; with one shared name the answers differ only in the object they point at.
OBJECT_NAMES = ["shape"] * 4


def shape_question(objects, kind):
    """(question, answers, right answer, rationales, right rationale) as texts for one kind.

    Kinds: 'leftmost', 'rightmost', 'topmost', 'bottommost'. The answer candidates are the four
    objects (by reference), the rationale candidates name the four colours.

    Colour and shape questions are not asked: a random-init ResNet-18 does not learn them within
    the 10-minute CPU budget (colour is under 1% of the RoI feature variance at initialisation,
    against about 30% for the box position), while these are learnt in a few hundred steps.
    """
    key, sign = EXTREMES[kind]
    target = max(range(4), key=lambda i: sign * objects[i][key])
    question = "Which one is the {} ?".format(kind)
    answers = ["It is [{}] .".format(i) for i in range(4)]
    rationales = ["It is the {} one .".format(c) for c in COLORS]
    return question, answers, target, rationales, list(COLORS).index(objects[target]["color"])


def write_shapes(out, split, num_questions, rng):
    """Scenes and annotations of the learnable part of one split; returns the records."""
    folder = os.path.join(out, "vcr1images", "shapes")
    os.makedirs(folder, exist_ok=True)
    test = split == "test"
    num_scenes = (num_questions + QUESTIONS_PER_SCENE - 1) // QUESTIONS_PER_SCENE
    # balanced label positions: every position 0..3 equally often (up to one)
    a_labels = rng.permutation(np.arange(num_questions) % 4)
    r_labels = rng.permutation(np.arange(num_questions) % 4)
    records = []
    for s in range(num_scenes):
        image, objects = make_scene(rng)
        name = "{}_{:05d}".format(split, s)
        image.save(os.path.join(folder, name + ".jpg"), quality=95)
        meta = {"boxes": [o["box"] + [1.0] for o in objects], "segms": [[o["polygon"]] for o in objects],
                "width": SCENE_SIZE, "height": SCENE_SIZE, "names": OBJECT_NAMES}
        with open(os.path.join(folder, name + ".json"), "w") as f:
            json.dump(meta, f)
        for kind in rng.choice(KINDS, size=QUESTIONS_PER_SCENE, replace=False):
            n = len(records)
            if n == num_questions:
                break
            q, answers, right, rationales, r_right = shape_question(objects, kind)
            answers, rights = _place(answers, right, a_labels[n], rng)
            rationales, r_rights = _place(rationales, r_right, r_labels[n], rng)
            records.append(annotation("shapes-{}-{}".format(split, n), "shapes/{}.jpg".format(name), OBJECT_NAMES,
                                      tokens(q), [tokens(a) for a in answers], [tokens(r) for r in rationales],
                                      rights, r_rights, test))
    return records


def _place(choices, right, position, rng):
    """Random order of ``choices`` with ``choices[right]`` at ``position``."""
    others = [c for i, c in enumerate(choices) if i != right]
    others = [others[i] for i in rng.permutation(len(others))]
    others.insert(int(position), choices[right])
    return others, int(position)


# ------------------------------------------------------------------------ real part
# name -> (skimage.data loader, objects, boxes [x1, y1, x2, y2] placed by eye, items). An item is
# (question, answers, rationales) with the right answer / rationale first; the order is shuffled
# when written. Names outside the 80 COCO classes get class id 0 in the data set.
REAL = {
    "astronaut": ("astronaut", ["person", "airplane", "helmet", "flag"],
                  [[20, 15, 365, 511], [355, 0, 472, 285], [275, 345, 505, 511], [0, 0, 95, 511]], [
        ("What is [0] wearing ?",
         ["An orange space suit .", "A black tuxedo .", "A swimsuit .", "A police uniform ."],
         ["[0] has mission patches and a helmet ring like astronauts wear .", "The suit of [0] is black and formal .",
          "[0] is standing on a beach .", "[0] has a badge and a police hat ."]),
        ("What is [1] ?",
         ["A model of a space shuttle .", "A real bird .", "A lamp .", "A tree ."],
         ["[1] is small and white with wings and a big orange tank .", "[1] is flying in the open sky .",
          "[1] gives light to the room .", "[1] has green leaves ."]),
        ("Why is [2] next to [0] ?",
         ["It is the helmet of her space suit .", "It is a fish bowl .", "It is a ball for a game .",
          "It is a lamp for reading ."],
         ["[2] is round and clear and fits the neck ring of [0] .", "There are fish swimming in [2] .",
          "[0] is standing on a football field .", "[0] is reading a book ."]),
    ]),
    "camera": ("camera", ["person", "camera", "tripod", "building"],
               [[0, 65, 335, 511], [255, 138, 330, 195], [228, 190, 405, 511], [410, 115, 445, 200]], [
        ("What is [0] doing ?",
         ["[0] is filming or taking photos with [1] .", "[0] is cooking dinner .", "[0] is swimming .",
          "[0] is sleeping on the grass ."],
         ["[0] looks into [1] which stands on [2] .", "There is a stove in front of [0] .",
          "[0] is in the water .", "[0] lies down with closed eyes ."]),
        ("Where are [0] and [2] ?",
         ["On a lawn in front of buildings .", "Inside a kitchen .", "On a boat at sea .",
          "In a forest at night ."],
         ["There is grass below [2] and [3] is far behind .", "There are pots on the wall .",
          "Water is all around them .", "It is dark and there are trees ."]),
        ("What is the weather like ?",
         ["Clear and bright .", "It is snowing hard .", "A storm with heavy rain .",
          "It is the middle of the night ."],
         ["The sky behind [3] is bright and the shadows are sharp .", "Snow covers the ground .",
          "[0] is wet and holds an umbrella .", "The sky is black and the lamps are on ."]),
    ]),
    "chelsea": ("chelsea", ["cat", "eye", "eye", "nose"],
                [[0, 0, 400, 299], [135, 85, 205, 148], [295, 108, 345, 165], [240, 222, 295, 262]], [
        ("What animal is [0] ?",
         ["A cat .", "A dog .", "A horse .", "A bird ."],
         ["[0] has whiskers , pointed ears and a small pink nose [3] .", "[0] barks and has floppy ears .",
          "[0] is large and has hooves .", "[0] has feathers and a beak ."]),
        ("What color are [1,2] ?",
         ["Yellow green .", "Blue .", "Red .", "Black and white stripes ."],
         ["The iris around each dark pupil is a yellow green .", "[1] looks like the sky .",
          "[1] looks bloodshot .", "[1] has stripes like a zebra ."]),
        ("Is [0] looking at the camera ?",
         ["Yes , it stares straight at it .", "No , it is asleep .", "No , it faces away .",
          "No , it is eating ."],
         ["Both [1] and [2] are open and face forward .", "[1] and [2] are closed .",
          "We only see the back of [0] .", "There is food in front of [3] ."]),
    ]),
    "coffee": ("coffee", ["cup", "spoon", "saucer", "diningtable"],
               [[175, 15, 410, 305], [325, 65, 425, 325], [75, 70, 480, 390], [0, 0, 599, 399]], [
        ("What is in [0] ?",
         ["Espresso coffee with crema .", "Orange juice .", "Soup with noodles .", "Nothing , it is empty ."],
         ["The drink is brown with a light foam on top , in a small cup .",
          "It is bright orange and served cold .", "There are noodles floating in it .",
          "We can see the bottom of [0] ."]),
        ("Why is [1] on [2] ?",
         ["To stir sugar into the coffee .", "To cut a steak .", "To dig in the garden .",
          "To eat soup from [3] ."],
         ["A small spoon next to a coffee cup is used for stirring .", "[1] is sharp like a knife .",
          "[3] is covered in soil .", "There is a soup bowl on [3] ."]),
        ("What is [3] made of ?",
         ["Wood .", "Glass .", "Metal .", "Plastic ."],
         ["[3] has a brown wood grain with scratches .", "We can see through [3] .",
          "[3] is shiny and gray .", "[3] is bright white and smooth ."]),
    ]),
    "rocket": ("rocket", ["rocket", "tower", "tower", "tower"],
               [[298, 125, 345, 410], [0, 0, 90, 426], [555, 0, 639, 426], [170, 120, 210, 420]], [
        ("What is [0] ?",
         ["A rocket on its launch pad .", "A lighthouse .", "A tall office building .", "A tree ."],
         ["[0] is white and pointed and stands between [1] and [2] .",
          "[0] is on a rocky coast with a light on top .", "[0] has many windows .",
          "[0] has branches and leaves ."]),
        ("What are [1] and [2] for ?",
         ["They hold lightning rods around the launch pad of [0] .", "They carry power lines .",
          "They are cranes building a house .", "They are rides at a fair ."],
         ["They are steel towers around [0] , taller than it .", "Wires hang between [1] and [2] .",
          "There are bricks and a half built house .", "There are lights of a carousel ."]),
        ("When was this photo taken ?",
         ["At dusk , just after sunset .", "At noon .", "In the middle of a sunny morning .",
          "During a snow storm ."],
         ["The sky above [0] is deep blue with some light near the horizon and the lamps are on .",
          "The sun is high and the sky is white .", "The shadows are long and the sky is bright .",
          "Snowflakes fill the air ."]),
    ]),
    "motorcycle": ("stereo_motorcycle", ["motorcycle", "bench", "bicycle", "bottle", "box"],
                   [[90, 95, 685, 450], [40, 105, 285, 305], [0, 150, 45, 230], [400, 55, 418, 92],
                    [528, 28, 595, 98]], [
        ("Where is [0] parked ?",
         ["In a garage or workshop .", "On a highway .", "In a living room .", "On a beach ."],
         ["There are shelves with [4] and [3] and a concrete floor .", "Cars are passing by .",
          "There is a sofa and a television .", "There is sand and water ."]),
        ("What color is [0] ?",
         ["Red .", "Green .", "Blue .", "White ."],
         ["The tank and the fenders of [0] are red .", "The tank of [0] is green .",
          "The tank of [0] is blue .", "The tank of [0] is white ."]),
        ("Can someone ride [0] now ?",
         ["Yes , it stands on its kickstand ready to go .", "No , it has no wheels .",
          "No , it is broken in half .", "No , it is under water ."],
         ["[0] has both wheels , a seat and handlebars .", "There are no wheels on [0] .",
          "[0] lies in two pieces .", "[0] is in a lake ."]),
    ]),
    "coins": ("coins", ["coin", "coin", "coin", "coin", "coin"],
              [[305, 15, 365, 85], [20, 30, 68, 80], [315, 155, 380, 225], [20, 230, 75, 285],
               [335, 245, 380, 295]], [
        ("What are [0] and [1] ?",
         ["Old coins .", "Cookies .", "Buttons of a shirt .", "Bottle caps ."],
         ["They are round metal pieces with heads stamped on them .", "They are brown and crumbly .",
          "They have holes for thread .", "They have a brand name printed on them ."]),
        ("Which is bigger , [0] or [1] ?",
         ["[0] is bigger .", "[1] is bigger .", "They are the same size .", "Both are tiny dots ."],
         ["[0] is wider and taller than [1] .", "[1] covers more of the picture than [0] .",
          "[0] and [1] have the same width .", "[0] and [1] are too small to see ."]),
        ("Where might [2] and [3] be kept ?",
         ["In a museum collection .", "In a wallet for shopping .", "In a piggy bank .",
          "In a vending machine ."],
         ["They are ancient and laid out in neat rows for display .", "They are new coins for everyday use .",
          "[2] is a toy .", "There is a slot for drinks ."]),
    ]),
    "hubble": ("hubble_deep_field", ["galaxy", "galaxy", "galaxy", "star"],
               [[105, 375, 145, 420], [700, 450, 750, 500], [270, 90, 310, 120], [735, 560, 770, 595]], [
        ("What is this picture showing ?",
         ["Many distant galaxies in deep space .", "The lights of a city at night .",
          "Fish in a dark aquarium .", "Sand on a beach ."],
         ["The background is black and [0] and [1] are glowing spirals and blobs .",
          "There are streets and buildings .", "[0] has fins .", "The background is yellow sand ."]),
        ("Why does [3] have spikes ?",
         ["It is a bright star ; the telescope adds the spikes .", "It is a spider .", "It is a firework .",
          "It is a snowflake ."],
         ["Bright points get diffraction spikes in telescope images , unlike [0] .", "[3] has eight legs .",
          "[3] is exploding over a city .", "[3] is white and cold ."]),
        ("What color is [1] ?",
         ["Orange .", "Green .", "Blue .", "Purple ."],
         ["[1] is a yellow orange glow , unlike the blue [0] .", "[1] looks like grass .",
          "[1] is the color of the sky .", "[1] looks like a grape ."]),
    ]),
    "ihc": ("immunohistochemistry", ["gland", "gland", "gland", "tissue"],
            [[0, 0, 270, 260], [270, 0, 460, 300], [250, 300, 390, 500], [380, 180, 511, 511]], [
        ("What kind of image is this ?",
         ["A stained tissue sample under a microscope .", "A satellite photo of fields .",
          "A painting of flowers .", "A map of a city ."],
         ["[0] and [2] are groups of cells stained brown , with blue nuclei in [3] .",
          "There are roads and farms .", "There are petals and a vase .", "There are street names ."]),
        ("Why are [0] and [1] brown ?",
         ["A stain marks a protein in those cells .", "They are burnt .", "They are made of chocolate .",
          "They are rusty ."],
         ["The stain colors the cells that carry the target protein brown .", "There is smoke around [0] .",
          "[1] is a dessert .", "[1] is old metal ."]),
        ("What color are the nuclei in [3] ?",
         ["Blue .", "Brown .", "Green .", "Black ."],
         ["A blue counterstain colors the nuclei of the unstained cells in [3] .", "[3] is as dark as [0] .",
          "[3] looks like leaves .", "[3] has no color at all ."]),
    ]),
    "clock": ("clock", ["clock"], [[145, 92, 275, 215]], [
        ("Why is [0] blurry ?",
         ["It was moving when the photo was taken .", "It is under water .", "It is on fire .",
          "It is made of glass ."],
         ["[0] is smeared sideways while the wall is sharp .", "There are bubbles around [0] .",
          "There is smoke above [0] .", "We can see through [0] ."]),
        ("What is behind [0] ?",
         ["A plain gray wall .", "A crowd of people .", "A forest .", "The ocean ."],
         ["The whole background is an even gray .", "There are faces behind [0] .",
          "There are trees behind [0] .", "There are waves behind [0] ."]),
        ("What shape is [0] ?",
         ["Round .", "Square .", "Triangular .", "Star shaped ."],
         ["[0] has a circular outline .", "[0] has four corners .", "[0] has three corners .",
          "[0] has five points ."]),
    ]),
    "text": ("text", ["paper", "writing", "writing"],
             [[0, 0, 447, 171], [0, 50, 80, 95], [165, 45, 285, 105]], [
        ("What is on [0] ?",
         ["Handwritten math .", "A printed photo .", "A drawing of a cat .", "A shopping list ."],
         ["[1] and [2] are handwritten symbols and brackets like in an equation .",
          "[0] shows a color picture .", "[0] shows whiskers and ears .", "[0] lists milk and eggs ."]),
        ("Why is [0] hard to read ?",
         ["It is photographed at a steep angle .", "It is wet .", "It is torn in pieces .",
          "It is written in invisible ink ."],
         ["The lines on [0] converge and [1] and [2] look stretched .", "The ink on [0] has run .",
          "[0] has ragged gaps .", "Nothing is written on [0] ."]),
        ("What was used to write [2] ?",
         ["A pen or pencil .", "A spray can .", "A typewriter .", "A paint roller ."],
         ["[2] is made of thin , hand drawn dark strokes .", "[2] has fuzzy edges and drips .",
          "The letters of [2] are all identical .", "[2] is a wide band of paint ."]),
    ]),
}


def real_image(loader):
    """RGB ``PIL.Image`` of a ``skimage.data`` photograph (first view of a stereo pair)."""
    import skimage.data
    array = getattr(skimage.data, loader)()
    if isinstance(array, tuple):
        array = array[0]
    return Image.fromarray(array).convert("RGB")


def write_real(out, rng):
    """Photographs, metadata and items of the real part; returns {split: records}."""
    folder = os.path.join(out, "vcr1images", "real")
    os.makedirs(folder, exist_ok=True)
    records = {split: [] for split in SPLITS}
    for name, (loader, objects, boxes, items) in REAL.items():
        image = real_image(loader)
        image.save(os.path.join(folder, name + ".jpg"), quality=92)
        w, h = image.size
        meta = {"boxes": [b + [1.0] for b in boxes],
                "segms": [[[[x1, y1], [x2, y1], [x2, y2], [x1, y2]]] for x1, y1, x2, y2 in boxes],
                "width": w, "height": h, "names": objects}
        with open(os.path.join(folder, name + ".json"), "w") as f:
            json.dump(meta, f)
        for k, (question, answers, rationales) in enumerate(items):
            split = SPLITS[k % len(SPLITS)]
            answers, a_label = _place(answers, 0, rng.randint(4), rng)
            rationales, r_label = _place(rationales, 0, rng.randint(4), rng)
            n = len(records[split])
            records[split].append(annotation(
                "real-{}-{}".format(split, n), "real/{}.jpg".format(name), objects, tokens(question),
                [tokens(a) for a in answers], [tokens(r) for r in rationales], a_label, r_label, split == "test"))
    return records


# ------------------------------------------------------------------------ main
def write_jsonl(path, records):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def zip_images(out):
    """``vcr1images.zip`` holding the folder ``vcr1images/`` (the VCR archive's layout)."""
    root = os.path.join(out, "vcr1images")
    with zipfile.ZipFile(os.path.join(out, "vcr1images.zip"), "w", zipfile.ZIP_STORED) as z:
        for dirpath, _, files in sorted(os.walk(root)):
            for fn in sorted(files):
                path = os.path.join(dirpath, fn)
                z.write(path, os.path.relpath(path, out))


def make_demo_data(out, seed=0, sizes=(3000, 500, 200), with_zip=False):
    """Write the demo data set under ``out``; returns ``{file name: number of items}``."""
    rng = np.random.RandomState(seed)
    real = write_real(out, rng)
    shapes = {split: write_shapes(out, split, n, rng) for split, n in zip(SPLITS, sizes)}
    files = {"train.jsonl": shapes["train"] + real["train"], "val.jsonl": shapes["val"] + real["val"],
             "val_shapes.jsonl": shapes["val"], "val_real.jsonl": real["val"],
             "test.jsonl": shapes["test"] + real["test"]}
    for fn, records in files.items():
        write_jsonl(os.path.join(out, fn), records)
    if with_zip:
        zip_images(out)
    return {fn: len(r) for fn, r in files.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="data/demo", help="output folder (default data/demo)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train", type=int, help="learnable training questions (default 3000)")
    parser.add_argument("--val", type=int, help="learnable validation questions (default 500)")
    parser.add_argument("--test", type=int, help="learnable test questions (default 200)")
    parser.add_argument("--zip", action="store_true", help="also write vcr1images.zip (DATASET.ZIP_MODE)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    sizes = [3000 if args.train is None else args.train, 500 if args.val is None else args.val,
             200 if args.test is None else args.test]
    counts = make_demo_data(args.out, args.seed, sizes, args.zip)
    for fn, n in counts.items():
        print("{:18s} {:5d} items".format(fn, n))
    print("demo data written to {}".format(args.out))


if __name__ == "__main__":
    main()
