"""The docs stay true (issue 28): in ``README.md``, ``docs/*.md``, ``CHANGELOG.md`` and the data and
pretrained-model pages they link to

* every relative link resolves: the file exists, and a ``#anchor`` names a heading of the target in
  GitHub's slug style;
* every config key written in backticks as ``SECTION.KEY`` / ``SECTION.SUB.KEY`` (and every key after
  ``--opts`` in a shown command) exists in some task's defaults;
* every ``scripts/...``, ``tools/...``, ``demo/...``, ``bench/...`` and ``<task>/*.py`` command of a fenced code block exists and
  accepts each ``--flag`` it is shown with: a Python script's ``--help`` lists it (all helps are read in
  one subprocess, which imports torch once), a shell script's text (its usage lines) names it; flags after
  a script that the command hands on (``dist_run_single.sh 4 vcr/train_end2end.py ... --opts``) belong
  to that script;
* the ``<!-- FIGURE: name -->`` blocks that the measured figures replace are closed, and the README
  stays short.

The checks are plain functions; the last tests feed them broken pages, so each can fail.
"""
import glob
import json
import os
import re
import shlex
import subprocess
import sys
from functools import lru_cache

import pytest

from tests.conftest import ROOT, load_task

TASK_NAMES = ("vcr", "vqa", "pretrain", "refcoco", "cls")
README_MAX_LINES = 150

FENCE = re.compile(r"^(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"`([^`]+)`")
# A dotted config key: an upper-case section, then keys (NETWORK.VLBERT.hidden_size); a value may follow.
KEY = re.compile(r"^([A-Z][A-Z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?=$|[:\s])")
# File names look like keys (README.md, PRETRAINED.model): their last part is an extension, never a key.
FILE_EXTENSIONS = {"md", "py", "sh", "yaml", "yml", "txt", "json", "jsonl", "model", "zip", "lmdb", "tar", "csv",
                   "npy", "png", "jpg", "log", "p", "pth", "safetensors", "cache", "doc"}
SCRIPT = re.compile(r"^(?:\./)?((?:scripts|tools|demo|bench)/[\w./-]+\.(?:py|sh)|(?:{})/\w+\.py)$".format("|".join(TASK_NAMES)))
SHELL_LANGS = {"", "bash", "sh", "shell", "console"}
PYTHONS = {"python", "python3", ".venv/bin/python", "$PY"}
FIGURE = re.compile(r"<!--\s*(/?)FIGURE:\s*([\w-]+)\s*-->")


# Pages outside docs/ that the docs link to for the details (data layouts, pretrained files).
LINKED_PAGES = ("CHANGELOG.md", "data/PREPARE_DATA.md", "model/pretrained_model/PREPARE_PRETRAINED_MODELS.md")


def doc_files():
    """The checked pages: README.md, docs/*.md and the :data:`LINKED_PAGES` present, as absolute paths."""
    files = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    return files + [p for p in (os.path.join(ROOT, name) for name in LINKED_PAGES) if os.path.isfile(p)]


def split_markdown(text):
    """(prose lines, fenced blocks) of a page: prose as (line number, line) outside fences; each block
    as (line number of its fence, info string, its lines)."""
    prose, blocks, block = [], [], None
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.lstrip()):
            if block is None:
                block = (number, line.lstrip()[3:].strip().lower(), [])
            else:
                blocks.append(block)
                block = None
        elif block is not None:
            block[2].append(line)
        else:
            prose.append((number, line))
    return prose, blocks


def github_slug(heading):
    """The anchor GitHub gives a heading: lower case, punctuation dropped (word characters, spaces
    and hyphens kept), each space a hyphen. ``"Tar shards (webdataset): `X`"`` -> ``tar-shards-webdataset-x``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


@lru_cache(maxsize=None)
def anchors(path):
    """The heading anchors of a Markdown file, duplicates numbered ``-1``, ``-2`` as GitHub does."""
    with open(path, encoding="utf-8") as f:
        prose, _ = split_markdown(f.read())
    found, seen = set(), {}
    for _, line in prose:
        m = HEADING.match(line)
        if m:
            slug = github_slug(m.group(2))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            found.add(slug if n == 0 else "{}-{}".format(slug, n))
    return found


def broken_links(path):
    """``'page:line: target: why'`` for each relative link of the page that does not resolve."""
    with open(path, encoding="utf-8") as f:
        prose, _ = split_markdown(f.read())
    problems = []
    for number, line in prose:
        for target in LINK.findall(CODE_SPAN.sub("", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            where = "{}:{}: {}".format(os.path.relpath(path, ROOT), number, target)
            if not os.path.exists(dest):
                problems.append("{}: no file {}".format(where, os.path.relpath(dest, ROOT)))
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                problems.append("{}: no heading with anchor #{} in {}".format(where, anchor, os.path.relpath(dest, ROOT)))
    return problems


def flatten_keys(node, prefix=""):
    """Every dotted key of a yacs CfgNode, nodes included (``NETWORK``, ``NETWORK.VLBERT``, ...)."""
    keys = set()
    for name, value in node.items():
        dotted = prefix + name
        keys.add(dotted)
        if isinstance(value, dict):
            keys |= flatten_keys(value, dotted + ".")
    return keys


@lru_cache(maxsize=1)
def known_keys():
    """The union of the config keys of every task's defaults (``Task.defaults()``)."""
    keys = set()
    for name in TASK_NAMES:
        keys |= flatten_keys(load_task(name).defaults())
    return frozenset(keys)


def config_key(text):
    """The dotted config key that ``text`` starts with (``"TRAIN.LR: 0"`` -> ``TRAIN.LR``), or None."""
    m = KEY.match(text.strip())
    if not m or m.group(1).rsplit(".", 1)[1].lower() in FILE_EXTENSIONS:
        return None
    return m.group(1)


def command_lines(block_lines):
    """The shell command lines of a fenced block: continuations joined, comments and blank lines dropped."""
    lines, current = [], ""
    for raw in block_lines:
        line = raw.rstrip()
        current += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            lines.append(current)
            current = ""
    if current:
        lines.append(current)
    return [c for c in (strip_comment(line).strip() for line in lines) if c]


def strip_comment(line):
    """The line without its trailing ``# comment`` (a ``#`` inside quotes stays)."""
    quote = None
    for i, ch in enumerate(line):
        if ch in "'\"" and quote in (None, ch):
            quote = None if quote else ch
        elif ch == "#" and quote is None and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def tokens(line):
    """Shell words of a command line, optional-part brackets dropped (``[--r-cfg`` -> ``--r-cfg``)."""
    try:
        words = shlex.split(line)
    except ValueError:
        words = line.split()
    return [w.strip("[]") for w in words if w.strip("[]")]


def invocations(line):
    """(script, its arguments) for each repository script on a command line, in order; the arguments of a
    script run until the next script (a launcher hands the rest to it). Quoted words holding a command
    (``sbatch --wrap "scripts/...  --opts ..."``) are searched too."""
    found, current = [], None
    for word in tokens(line):
        if " " in word:
            found += invocations(word)
            continue
        m = SCRIPT.match(word)
        if m:
            current = (m.group(1), [])
            found.append(current)
        elif current is not None:
            current[1].append(word)
    return found


def shown_flags(args):
    """(subcommand or None, the ``--flags`` before ``--opts``, the config keys after it) of a script's arguments."""
    flags, keys, in_opts = [], [], False
    sub = args[0] if args and re.match(r"^[a-z][\w-]*$", args[0]) else None
    for word in args:
        if in_opts:
            key = config_key(word)
            if key:
                keys.append(key)
        elif word.startswith("--"):
            flag = word.split("=", 1)[0]
            flags.append(flag)
            in_opts = flag == "--opts"
    return sub, flags, keys


HELP_RUNNER = r"""
import contextlib, io, json, os, runpy, sys
sys.path.insert(0, os.getcwd())
import torch  # noqa: F401  (imported once for all scripts)
baseline = set(sys.modules)
PACKAGES = {"common", "vcr", "vqa", "pretrain", "refcoco", "cls"}
out = {}
for argv in json.loads(sys.argv[1]):
    buf = io.StringIO()
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))  # as `python script` puts it first
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit:
        pass
    except Exception as e:  # a script that breaks before its parser: its help is the error
        buf.write("HELP-ERROR {}: {}".format(type(e).__name__, e))
    out[" ".join(argv)] = buf.getvalue()
    del sys.path[0]
    # Each task folder has its own _init_paths (and scripts their own helpers): forget the modules that
    # are not in the repository's packages, so the next script imports its own; torch & co. stay loaded.
    for name in set(sys.modules) - baseline:
        path = getattr(sys.modules[name], "__file__", None) or ""
        if path.startswith(os.getcwd() + os.sep) and ".venv" not in path and name.split(".")[0] not in PACKAGES:
            del sys.modules[name]
print(json.dumps(out))
"""


_HELPS = {}


def python_helps(argvs):
    """``{" ".join(argv): its --help output}`` for each ``[script, ..., "--help"]``; those not read before
    in this session are run in one subprocess."""
    missing = [list(a) for a in argvs if " ".join(a) not in _HELPS]
    if missing:
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
        proc = subprocess.run([sys.executable, "-c", HELP_RUNNER, json.dumps(missing)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        _HELPS.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    return {" ".join(a): _HELPS[" ".join(a)] for a in argvs}


def subcommands(help_text):
    """The subcommand names of an argparse help (``{to-shards,from-shards,index}``)."""
    m = re.search(r"\{([\w,-]+)\}", help_text)
    return set(m.group(1).split(",")) if m else set()


def inline_command(span):
    """Whether a code span of the prose is a command line: it starts with a repository script, or with
    ``python`` and one (``python bench/x.py --flag``, ``./scripts/run_demo.sh vqa``)."""
    words = tokens(span)
    if words and words[0] in PYTHONS:
        words = words[1:]
    return bool(words) and SCRIPT.match(words[0]) is not None


def shown_commands(paths):
    """(page:line, script, arguments) of every repository script in the shell blocks of the pages, and in
    the prose's code spans that are command lines (the README's task table)."""
    shown = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            prose, blocks = split_markdown(f.read())
        page = os.path.relpath(path, ROOT)
        for start, lang, lines in blocks:
            if lang not in SHELL_LANGS:
                continue
            for line in command_lines(lines):
                shown += [("{}:{}".format(page, start), script, args) for script, args in invocations(line)]
        for number, line in prose:
            for span in CODE_SPAN.findall(line):
                if inline_command(span):
                    shown += [("{}:{}".format(page, number), script, args) for script, args in invocations(span)]
    return shown


def command_problems(paths):
    """``'page:line: script: why'`` for each shown command whose script is missing or refuses a shown flag
    or config key."""
    shown = shown_commands(paths)
    problems, argvs = [], []
    for where, script, args in shown:
        if not os.path.isfile(os.path.join(ROOT, script)):
            problems.append("{}: {}: no such script".format(where, script))
        elif script.endswith(".py"):
            argvs.append([script, "--help"])
    helps = python_helps(sorted(set(map(tuple, argvs)))) if argvs else {}
    sub_argvs = set()
    for where, script, args in shown:
        sub = shown_flags(args)[0]
        if script.endswith(".py") and sub in subcommands(helps.get(script + " --help", "")):
            sub_argvs.add((script, sub, "--help"))
    if sub_argvs:
        helps.update(python_helps(sorted(sub_argvs)))
    keys = known_keys()
    for where, script, args in shown:
        path = os.path.join(ROOT, script)
        if not os.path.isfile(path):
            continue
        sub, flags, opts_keys = shown_flags(args)
        if script.endswith(".sh"):
            if not os.access(path, os.X_OK):
                problems.append("{}: {}: not executable".format(where, script))
            with open(path, encoding="utf-8") as f:
                accepted = f.read()
        else:
            accepted = helps[script + " --help"]
            if "HELP-ERROR" in accepted:
                problems.append("{}: {} --help failed: {}".format(where, script, accepted.split("HELP-ERROR", 1)[1]))
                continue
            accepted += helps.get("{} {} --help".format(script, sub), "")
        accepted_flags = set(re.findall(r"--[\w-]+", accepted))
        problems += ["{}: {}: does not accept {}".format(where, script, f) for f in flags if f not in accepted_flags]
        problems += ["{}: {}: --opts {}: no such config key".format(where, script, k) for k in opts_keys
                     if k not in keys]
    return problems


def unknown_keys(path):
    """``'page:line: KEY'`` for each backticked config key of the page's prose that no task defines."""
    with open(path, encoding="utf-8") as f:
        prose, _ = split_markdown(f.read())
    text = "\n".join(line for _, line in prose)
    line_of = {}
    for number, line in prose:
        for span in CODE_SPAN.findall(line):
            line_of.setdefault(span, number)
    problems = []
    for span in CODE_SPAN.findall(text):  # spans may wrap over two lines
        key = config_key(span)
        if key and key not in known_keys():
            problems.append("{}:{}: {}".format(os.path.relpath(path, ROOT), line_of.get(span, "?"), key))
    return problems


def figure_problems(path):
    """Unclosed, unopened or nested ``<!-- FIGURE: name -->`` blocks of a page."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    problems, open_name = [], None
    for m in FIGURE.finditer(text):
        closing, name = m.group(1) == "/", m.group(2)
        if closing and open_name != name:
            problems.append("{}: /FIGURE: {} closes nothing open".format(os.path.relpath(path, ROOT), name))
        elif not closing and open_name:
            problems.append("{}: FIGURE: {} opens inside {}".format(os.path.relpath(path, ROOT), name, open_name))
        open_name = None if closing else name
    if open_name:
        problems.append("{}: FIGURE: {} is never closed".format(os.path.relpath(path, ROOT), open_name))
    return problems


# A file of the project named in prose, a code span, a comment or a docstring: scripts/run_demo.sh, tools/x.py.
NAMED_FILE = re.compile(r"(?<![\w./-])((?:scripts|tools|demo|bench)/[\w-]+\.(?:py|sh))\b")
# Where files are named for a reader: the pages, the configs and the product's own code and scripts.
NAMING_FILES = ("*.md", "docs/*.md", "data/*.md", "cfgs/**/*.yaml", "common/**/*.py", "scripts/*", "tools/*.py",
                "demo/*", "bench/*", "vcr/**/*.py", "vqa/**/*.py", "refcoco/**/*.py", "pretrain/**/*.py",
                "cls/**/*.py", ".ci/run")


def missing_named_files(paths):
    """``path:line: names X, which does not exist`` for each :data:`NAMED_FILE` of the files ``paths`` that is
    not a file of the repository (a path left behind by a move, a renamed script)."""
    problems = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                for name in NAMED_FILE.findall(line):
                    if not os.path.isfile(os.path.join(ROOT, name)):
                        problems.append("{}:{}: names {}, which does not exist".format(
                            os.path.relpath(path, ROOT), n, name))
    return problems


# --- the project's pages -------------------------------------------------------------------------

def test_links_resolve():
    problems = [p for path in doc_files() for p in broken_links(path)]
    assert not problems, "\n".join(problems)


def test_named_files_exist():
    paths = sorted({p for pattern in NAMING_FILES for p in glob.glob(os.path.join(ROOT, pattern), recursive=True)
                    if os.path.isfile(p)})
    assert len(paths) > 100  # the pages, configs and code are found: the check is not empty
    problems = missing_named_files(paths)
    assert not problems, "\n".join(problems)


def test_config_keys_exist():
    problems = [p for path in doc_files() for p in unknown_keys(path)]
    assert not problems, "\n".join(problems)


def test_shown_commands_exist_and_accept_their_flags():
    assert len(shown_commands(doc_files())) >= 20  # the pages do show commands: the check is not empty
    problems = command_problems(doc_files())
    assert not problems, "\n".join(problems)


def test_figure_blocks_closed_and_readme_short():
    problems = [p for path in doc_files() for p in figure_problems(path)]
    assert not problems, "\n".join(problems)
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        assert len(f.read().splitlines()) <= README_MAX_LINES


def test_every_docs_page_is_linked_from_the_readme():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    unlinked = [os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))
                if "(docs/{})".format(os.path.basename(p)) not in readme]
    assert not unlinked, ("docs pages missing from README.md's tables: {}; add one row each "
                          "(| subject | [docs/x.md](docs/x.md) |)".format(unlinked))


# --- the checks fail on broken pages -------------------------------------------------------------

def test_github_slug():
    assert github_slug("Tar shards (webdataset / img2dataset): `DATASET.DATASET: 'cc_shards'`") == \
        "tar-shards-webdataset--img2dataset-datasetdataset-cc_shards"
    assert github_slug("VQA v2 (Visual Question Answering)") == "vqa-v2-visual-question-answering"
    assert github_slug("Image classification (`cls/`): CIFAR-10, CIFAR-100, ImageFolder") == \
        "image-classification-cls-cifar-10-cifar-100-imagefolder"


def test_checks_report_broken_pages(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n"
        "[ok](other.md#other-page) [ok](other.md#twice-1) [ok](#page) [web](https://example.org/x)\n"
        "[gone](missing.md) [bad anchor](other.md#nowhere) [self](#nope)\n"
        "`TRAIN.LR: 0` `NETWORK.VLBERT.hidden_size` `README.md` `TRAIN.NO_SUCH_KEY` `TRAIN.WARMUP*`\n"
        "```\n# ## not a heading\n```\n"
        "<!-- FIGURE: a -->\nx\n<!-- FIGURE: b -->\n")
    links = broken_links(str(page))
    assert len(links) == 3 and "no file" in links[0] and "#nowhere" in links[1] and "#nope" in links[2]
    assert [p.rsplit(": ", 1)[1] for p in unknown_keys(str(page))] == ["TRAIN.NO_SUCH_KEY"]
    assert len(figure_problems(str(page))) == 2  # b opens inside a, b never closed


def test_named_file_check_reports_old_paths(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("run `scripts/run_demo.sh`, then tools/predict.py;\n"
                    "# the old home: scripts/predict.py (and demo/no_such.sh)\n")
    assert [p.split(": ", 1)[1] for p in missing_named_files([str(page)])] == [
        "names scripts/predict.py, which does not exist", "names demo/no_such.sh, which does not exist"]


def test_command_check_reports_unknown_flags_keys_and_scripts(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "```bash\n"
        "python vcr/val.py --a-cfg CFG [--r-ckpt CKPT] --no-such-flag  # comment --ignored\n"
        "./scripts/dist_run_single.sh 2 vqa/test.py CFG --ckpt C \\\n    --opts TRAIN.LR 1 TRAIN.NOPE 2\n"
        "python tools/convert_cc_shards.py index --shards 'a/{0..1}.tar' --workers 2\n"
        "./scripts/run_tests.sh --runslow --slowest\n"
        "python bench/no_such_bench.py\n"
        "```\n"
        "```json\n{\"python vcr/val.py --ignored\": 1}\n```\n"
        "Inline: `python vqa/eval.py --result R --bogus`, not a command: `vqa/eval.py` alone is, `see --x`.\n")
    problems = command_problems([str(page)])
    assert len(problems) == 5, problems
    assert "page.md:12: vqa/eval.py: does not accept --bogus" in problems[4]
    assert "vcr/val.py: does not accept --no-such-flag" in problems[1]
    assert "vqa/test.py: --opts TRAIN.NOPE: no such config key" in problems[2]
    assert "scripts/run_tests.sh: does not accept --slowest" in problems[3]
    assert "bench/no_such_bench.py: no such script" in problems[0]
