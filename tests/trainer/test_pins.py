"""The trainer image's pinned set: exact, closed, resolvable for Python 3.11, and what CI runs.

The image installs torch 2.7.1+cu118 from the PyTorch index and then this file; CI installs the
same file as constraints. The dry run resolves the file against the package index for a
Python 3.11 manylinux target, the platform of the image.
"""

import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

REQUIREMENTS = Path(__file__).resolve().parents[2] / "trainer_image" / "requirements.txt"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!-]+)$")
# torch brings its own CUDA libraries; they follow torch's flavour (cu118 in the image).
TORCH_FLAVOUR = re.compile(r"^(nvidia-.*|triton)$")
# Pure-Python projects PyPI has only as an sdist (rouge-score: the evaluation's ROUGE-L): the image
# builds them from source, so the binary-only dry run below resolves the rest and their own
# requirements, which are pinned like any other package.
SDIST_ONLY = frozenset({"rouge-score"})
# glibc 2.35 (Ubuntu 22.04) accepts every manylinux tag up to 2_35.
PLATFORMS = [f"manylinux_2_{v}_x86_64" for v in (17, 24, 26, 27, 28, 31, 34, 35)] + ["manylinux2014_x86_64"]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> dict[str, str]:
    found: dict[str, str] = {}
    for number, raw in enumerate(REQUIREMENTS.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = PIN.match(line)
        assert match, f"requirements.txt line {number}: {raw!r} is not an exact name==version pin"
        name = canonical(match.group(1))
        assert name not in found, f"requirements.txt line {number}: {name} pinned twice"
        found[name] = match.group(2)
    return found


def test_pins_are_exact_and_carry_the_recipe() -> None:
    pinned = pins()
    assert pinned["torch"] == "2.7.1"  # the last torch with cu118 wheels (Pascal code)
    for name in ("transformers", "peft", "bitsandbytes", "trl", "accelerate", "datasets", "kubernetes", "pydantic"):
        assert name in pinned, f"{name} is not pinned"
    assert "kopf" not in pinned  # the trainer image carries no operator


def test_ci_runs_the_pinned_versions() -> None:
    wrong = {}
    for name, version in pins().items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            wrong[name] = f"pinned {version}, not installed"
            continue
        # torch's local label (+cu118 in the image, +cu126 or +cpu in CI) is the only allowed difference
        if installed.split("+")[0] != version:
            wrong[name] = f"pinned {version}, installed {installed}"
    assert wrong == {}


# Not the fast tier: the dry run resolves the trainer image's set against the package index (~20 s).
@pytest.mark.trainer
def test_pinned_set_resolves_for_python_311_and_is_closed(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
    command += ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "--only-binary=:all:"]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    wheels = tmp_path / "wheels.txt"
    wheels.write_text("".join(f"{n}=={v}\n" for n, v in pins().items() if n not in SDIST_ONLY))
    sdist_needs = [r for n in sorted(SDIST_ONLY) for r in _requirements(n)]
    command += ["--target", str(tmp_path / "target"), "--report", str(report), "-r", str(wheels), *sdist_needs]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    resolved = {
        canonical(i["metadata"]["name"]): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]
    }
    pinned = pins()
    resolved.update({n: pinned[n] for n in SDIST_ONLY})
    unpinned = sorted(n for n in resolved if n not in pinned and not TORCH_FLAVOUR.match(n))
    assert unpinned == [], f"resolved but not pinned (the image would float on these): {unpinned}"
    assert {n: v for n, v in resolved.items() if n in pinned and v != pinned[n]} == {}


def _requirements(name: str) -> list[str]:
    """An sdist-only pin's own requirements (from the installed copy CI tested), as pins."""
    wanted = [canonical(re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0]) for r in metadata.requires(name) or []]
    pinned = pins()
    missing = [w for w in wanted if w not in pinned]
    assert missing == [], f"{name} needs {missing}, which requirements.txt does not pin"
    return [f"{w}=={pinned[w]}" for w in wanted]
