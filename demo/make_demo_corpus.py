"""Write a small public-domain English text corpus for the pretraining demo (no download).

The text comes from what every CPython installation ships:

- the Zen of Python (Tim Peters, PEP 20, placed in the public domain), kept rot13-encoded in
  the standard library module ``this`` (19 aphorisms);
- Polonius' advice to Laertes, Hamlet act 1 scene 3 (Shakespeare, public domain), the
  ``HAMLET_SCENE`` test text of ``test/test_zlib.py`` in CPython's ``test`` package (38 verse
  lines). Some Linux distributions package ``test`` separately (Debian: ``libpython3.X-testsuite``);
  without it the corpus holds the Zen alone.

Both are read from the module source files (``ast``), not imported, so nothing is printed or run.
Output: one passage per line (an aphorism or a verse line), the ``general_corpus`` format; the
data set joins short passages up to ``DATASET.MIN_SEQ_LEN`` words.

Usage: python demo/make_demo_corpus.py [--out data/demo/en_corpus/demo.doc]
"""
import argparse
import ast
import codecs
import os
import sysconfig


def stdlib_file(relpath):
    """Path of ``relpath`` in this interpreter's standard library folder (whether or not it exists).

    Found from ``sysconfig``, not by import: a test run may have put another ``test`` package first."""
    return os.path.join(sysconfig.get_paths()["stdlib"], relpath)


def _constant(relpath, name):
    """The literal assigned to ``name`` at the top level of the standard library file ``relpath``,
    or None when the file is not installed."""
    path = stdlib_file(relpath)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    return None


def zen_of_python():
    """The 19 aphorisms of PEP 20 (list of str), decoded from the ``this`` module."""
    text = codecs.decode(_constant("this.py", "s"), "rot13")
    return [line.strip() for line in text.splitlines()[2:] if line.strip()]  # after title and blank line


def hamlet_scene():
    """The verse lines of CPython's ``HAMLET_SCENE`` (list of str), without speaker names and stage
    directions; empty when the ``test`` package is not installed."""
    scene = _constant(os.path.join("test", "test_zlib.py"), "HAMLET_SCENE")
    if scene is None:
        return []
    lines = scene.decode("ascii").splitlines()
    # verse is indented; speaker names are not; 'Enter POLONIUS' is a stage direction
    return [line.strip() for line in lines if line.startswith(" ") and not line.strip().startswith("Enter ")]


def demo_passages():
    """Passages of the demo corpus: the Zen of Python, then the Hamlet verse lines (list of str)."""
    return zen_of_python() + hamlet_scene()


def write_corpus(path):
    """Write ``demo_passages()`` to ``path``, one per line (folders created). Returns the count."""
    passages = demo_passages()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(passages) + "\n")
    return len(passages)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join("data", "demo", "en_corpus", "demo.doc"),
                        help="corpus file to write (default: %(default)s)")
    args = parser.parse_args()
    count = write_corpus(args.out)
    print("wrote {} passages to {}".format(count, args.out))


if __name__ == "__main__":
    main()
