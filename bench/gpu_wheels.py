"""The wheels that travel with the working tree to the GPU machine (no network there, Python 3.12), in ``.whl/``.

    # here, with pip's network: cp312 manylinux x86-64 wheels of bench/gpu_wheels.txt into .whl/, then checks
    # that every requirement of every wheel is met (by another wheel or by what the GPU machine has) and that
    # they take less than 64 MiB (what travels with the tree)
    python bench/gpu_wheels.py download
    # on the GPU machine (bench/gpu_suite.sh does it): the wheels whose distribution is not installed, into DIR
    python bench/gpu_wheels.py install --target /tmp/site

``install`` runs ``pip install --no-index --no-deps --target DIR`` on the missing ones (or, without pip, unpacks
them: a wheel is a zip of its installed files, PEP 427) and prints DIR, for ``PYTHONPATH``. Exit codes: 0, 1 when
a check fails, 2 for a missing ``.whl/``.
"""
import argparse
import glob
import importlib.metadata
import os
import re
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WHEELS = os.path.join(ROOT, ".whl")
LIST = os.path.join(ROOT, "bench", "gpu_wheels.txt")
LIMIT_MIB = 64
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64")
# What the GPU machine has installed (the list) and what those bring along that the wheels need.
ON_MACHINE = {"torch", "torchvision", "timm", "tensorboard", "matplotlib", "pillow", "pyyaml", "tqdm",
              "scikit-image", "numpy", "onnx", "onnxruntime", "protobuf", "packaging", "typing-extensions"}
MARKER_ENV = {"python_version": "3.12", "python_full_version": "3.12.0", "sys_platform": "linux",
              "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
              "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}


def canonical(name):
    """PEP 503 normalised distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def metadata(path):
    """(name, version, [Requires-Dist lines]) of the wheel file ``path``."""
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode("utf-8")
    fields = [line.split(": ", 1) for line in text.split("\n\n", 1)[0].splitlines() if ": " in line]
    get = lambda key: [v for k, v in fields if k == key]  # noqa: E731
    return get("Name")[0], get("Version")[0], get("Requires-Dist")


def unmet(paths):
    """Requirements (for Python 3.12 on Linux x86-64) of the wheels ``paths`` that neither another wheel nor
    :data:`ON_MACHINE` meets, as readable lines."""
    from packaging.requirements import Requirement

    have = {canonical(n): v for n, v, _ in map(metadata, paths)}
    problems = []
    for path in paths:
        name, _, requires = metadata(path)
        for line in requires:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate(MARKER_ENV):
                continue
            dist = canonical(req.name)
            if dist in have:
                if not req.specifier.contains(have[dist], prereleases=True):
                    problems.append("{} needs {}, the wheel is {}".format(name, line, have[dist]))
            elif dist not in ON_MACHINE:
                problems.append("{} needs {}: no wheel, not on the GPU machine".format(name, line))
    return problems


def download():
    os.makedirs(WHEELS, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", "--abi", "cp312", "-d", WHEELS, "-r", LIST]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    if subprocess.run(cmd).returncode:
        return 1
    paths = sorted(glob.glob(os.path.join(WHEELS, "*.whl")))
    problems = unmet(paths)
    size = sum(os.path.getsize(p) for p in paths) / 2 ** 20
    print("{} wheels in {}: {:.1f} MiB (limit {} MiB)".format(len(paths), WHEELS, size, LIMIT_MIB))
    for p in problems:
        print("error: " + p)
    if size >= LIMIT_MIB:
        print("error: the wheels take {:.1f} MiB, more than the {} MiB that travel".format(size, LIMIT_MIB))
    return 1 if problems or size >= LIMIT_MIB else 0


def installed(name):
    try:
        importlib.metadata.version(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def install(target):
    paths = sorted(glob.glob(os.path.join(WHEELS, "*.whl")))
    if not paths:
        print("error: no wheels in {} (python bench/gpu_wheels.py download)".format(WHEELS), file=sys.stderr)
        return 2
    missing = [p for p in paths if not installed(metadata(p)[0])]
    print("wheels: {} of {} missing here: {}".format(len(missing), len(paths), ", ".join(
        metadata(p)[0] for p in missing) or "none"), file=sys.stderr)
    if missing:
        os.makedirs(target, exist_ok=True)
        has_pip = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0
        if has_pip:
            done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet",
                                   "--disable-pip-version-check", "--upgrade", "--target", target] + missing)
            if done.returncode:
                return 1
        else:
            for p in missing:
                with zipfile.ZipFile(p) as z:
                    z.extractall(target)
    print(target)
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=["download", "install"])
    parser.add_argument("--target", default="/tmp/site", help="install: folder to install into (default /tmp/site)")
    args = parser.parse_args()
    return download() if args.action == "download" else install(args.target)


if __name__ == "__main__":
    sys.exit(main())
