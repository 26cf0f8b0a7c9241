"""llama.cpp, pinned: its converters for the GGUF export, and llama-cpp-python to test the result.

The `llama-cpp-python` sdist vendors one llama.cpp tree: `convert_hf_to_gguf.py`,
`convert_lora_to_gguf.py`, their `conversion/` package and the matching `gguf-py`. Those are
what the trainer runs (the trainer image unpacks the same sdist), so the GGUF files are written
by llama.cpp's own code, and read back in the tests by the same llama.cpp compiled from it.

Only package registries are reachable: the sdist comes from the package index and is built here
with the machine's compiler (pip's isolated build brings scikit-build-core, and cmake and ninja
from the index where the machine has none). A build happens once per version,
under a lock, into a temporary folder renamed into place, like the Go binaries (hack/cluster):

    ~/.cache/finetune-operator/llama-cpp-python/<version>/
        sdist/llama_cpp_python-<version>.tar.gz
        llama.cpp/       convert_*.py, conversion/, gguf-py/   (`converters`)
        python/llama_cpp/  the sdist's bindings + lib/libllama.so  (`python_package`)
        tools/           llama-server, llama-quantize, linked statically  (`tools`)

    python -m hack.llama_cpp converters   # unpack the converters; prints their folder
    python -m hack.llama_cpp python       # build libllama once; prints the folder for sys.path
    python -m hack.llama_cpp tools        # build llama-server and llama-quantize once; prints their folder
    python -m hack.llama_cpp sdist        # download the sdist once; prints its path (bench/serving.py packs it)

The tools are what `status.output.formats[].serve` runs (`llama-server -m ...`) and what the
trainer quantizes with (`llama-quantize`, for `ggufType: q4_k_m`); the trainer image builds its
llama-quantize from the same tree with the same flags (tests/images checks them).
"""

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from .cache import binary_cache_root, cache_lock

VERSION = "0.3.36"
# Where the converters and the tools land in the cache (`llama_cpp_env` hands them to the node
# agent's pods).
CONVERTERS_DIR = "llama.cpp"
TOOLS_DIR = "tools"
# The gguf package its llama.cpp vendors (gguf-py/pyproject.toml): the image installs this one.
GGUF_VERSION = "0.19.0"
PACKAGE = "llama-cpp-python"
VENDOR = "vendor/llama.cpp"
PYTHON_ENV = "LLAMA_CPP_PYTHON"
TOOLS_ENV = "LLAMA_CPP_TOOLS"
TOOLS = ("llama-server", "llama-quantize")
CONVERTER_PARTS = ("convert_hf_to_gguf.py", "convert_lora_to_gguf.py", "conversion", "gguf-py")
# A CPU build of the library alone: no native tuning (a cached build may move between machines
# of one kind), no tools, examples, tests, common or multimodal library: the bindings load
# libllama and ggml, and the rest would double a build on two cores (pip's wheel build of the
# sdist compiles all of it: over 40 minutes here).
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_COMMON=OFF",
    "-DLLAMA_CURL=OFF",
    # libllama finds ggml beside itself wherever the folder is copied to.
    "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
    "-DCMAKE_INSTALL_RPATH=$ORIGIN",
)


# The two tools, linked statically (the folder runs wherever it is copied): the common library,
# the tools' and the server's CMake folders are switched on so that the two targets exist, and
# only those two are built. No UI (the server's web page is not needed and its prebuilt assets
# would be downloaded), no curl or OpenSSL (models are local files), no tests, examples or app.
TOOLS_CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_COMMON=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
)
# The serving image's llama-server (serving_image/Dockerfile): the tools' flags with CUDA on, for
# the compute capability of every GPU product the planner knows (finetune_plan/gpu_products.py,
# by the name it gives each): Pascal's sm_60/61 first. tests/images holds the Dockerfile to both,
# and bench/serving.py builds with the Dockerfile's flags for the machine's own architecture.
SERVING_CMAKE_FLAGS = (*TOOLS_CMAKE_FLAGS, "-DGGML_CUDA=ON")
CUDA_ARCHITECTURES = {
    "Tesla-P40": "61",
    "Tesla-P100-PCIE-12GB": "60",
    "Tesla-P100-PCIE-16GB": "60",
    "Tesla-V100-32GB": "70",
    "Tesla-V100-16GB": "70",
    "NVIDIA-A100-80GB": "80",
    "NVIDIA-A100-40GB": "80",
    "NVIDIA-H100-PCIe": "90",
    "NVIDIA-H100-80GB-HBM3": "90",
    "NVIDIA-H200": "90",
}
# Compiles share the machine with whatever else runs on it: two jobs at most, at the lowest priority.
MAX_JOBS = 2


def _niced(command: list[str]) -> list[str]:
    return ["nice", "-n", "19", *command] if shutil.which("nice") else command


def cache_dir(version: str = VERSION) -> Path:
    return binary_cache_root() / "llama-cpp-python" / version


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "-q", *args], check=True)


def sdist(version: str = VERSION) -> Path:
    """The pinned sdist, downloaded once."""
    folder = cache_dir(version) / "sdist"
    found = sorted(folder.glob("*.tar.gz")) if folder.is_dir() else []
    if found:
        return found[0]
    # `python -m hack.llama_cpp sdist` may be the first call on a new machine: no cache folder yet
    cache_dir(version).mkdir(parents=True, exist_ok=True)
    temp = Path(tempfile.mkdtemp(prefix=".sdist-", dir=cache_dir(version)))
    _pip("download", "--no-deps", "--no-binary", ":all:", f"{PACKAGE}=={version}", "-d", str(temp))
    shutil.rmtree(folder, ignore_errors=True)
    temp.rename(folder)
    return sorted(folder.glob("*.tar.gz"))[0]


def converters(version: str = VERSION) -> Path:
    """llama.cpp's converters and gguf-py from the sdist, unpacked once; returns their folder."""
    target = cache_dir(version) / CONVERTERS_DIR
    if (target / "convert_hf_to_gguf.py").is_file():
        return target
    with cache_lock(cache_dir(version)):
        if (target / "convert_hf_to_gguf.py").is_file():
            return target
        archive = sdist(version)
        temp = Path(tempfile.mkdtemp(prefix=".llama.cpp-", dir=cache_dir(version)))
        with tarfile.open(archive) as tar:
            root = tar.getnames()[0].split("/")[0]
            prefixes = tuple(f"{root}/{VENDOR}/{part}" for part in CONVERTER_PARTS)
            members = [m for m in tar.getmembers() if m.name.startswith(prefixes)]
            tar.extractall(temp, members=members, filter="data")
        (temp / root / VENDOR).rename(temp / "tree")
        (temp / "tree").rename(target)
        shutil.rmtree(temp)
    return target


def _build_library(source: Path, build: Path) -> Path:
    """libllama and ggml, shared, for the CPU: the only targets the bindings load."""
    configure = ["cmake", "-S", str(source), "-B", str(build), "-DBUILD_SHARED_LIBS=ON", *CMAKE_FLAGS]
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    subprocess.run(configure, check=True, stdout=subprocess.DEVNULL)
    jobs = str(os.cpu_count() or 2)
    subprocess.run(
        ["cmake", "--build", str(build), "--target", "llama", "-j", jobs], check=True, stdout=subprocess.DEVNULL
    )
    return build / "bin"


def python_package(version: str = VERSION) -> Path:
    """The folder to put on sys.path for `import llama_cpp`: the sdist's bindings with libllama
    and ggml built from its vendored llama.cpp in `llama_cpp/lib`, where they look first. Built
    once per version (minutes on two cores). `LLAMA_CPP_PYTHON`, when set, names such a folder
    built elsewhere, as KUBEBUILDER_ASSETS does for the Go binaries."""
    supplied = os.environ.get(PYTHON_ENV)
    if supplied:
        return Path(supplied)
    target = cache_dir(version) / "python"
    if (target / "llama_cpp" / "lib" / "libllama.so").exists():
        return target
    with cache_lock(cache_dir(version)):
        if (target / "llama_cpp" / "lib" / "libllama.so").exists():
            return target
        temp, root = _unpacked(version, ".build-")
        lib = _build_library(root / VENDOR, temp / "build")
        package = temp / "python" / "llama_cpp"
        shutil.copytree(root / "llama_cpp", package, ignore=shutil.ignore_patterns("server"))
        (package / "lib").mkdir()
        for item in lib.glob("*.so*"):
            shutil.copy2(item, package / "lib" / item.name, follow_symlinks=False)
        shutil.rmtree(target, ignore_errors=True)
        (temp / "python").rename(target)
        shutil.rmtree(temp)
    return target


def _unpacked(version: str, prefix: str) -> tuple[Path, Path]:
    """A temporary folder in the version's cache holding the unpacked sdist, and the sdist's root."""
    temp = Path(tempfile.mkdtemp(prefix=prefix, dir=cache_dir(version)))
    with tarfile.open(sdist(version)) as tar:
        tar.extractall(temp / "src", filter="data")
    return temp, next((temp / "src").iterdir())


def _build_tools(source: Path, build: Path) -> Path:
    configure = ["cmake", "-S", str(source), "-B", str(build), *TOOLS_CMAKE_FLAGS]
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    subprocess.run(configure, check=True, stdout=subprocess.DEVNULL)
    jobs = str(min(MAX_JOBS, os.cpu_count() or 1))
    build_command = ["cmake", "--build", str(build), "--target", *TOOLS, "-j", jobs]
    subprocess.run(_niced(build_command), check=True, stdout=subprocess.DEVNULL)
    return build / "bin"


def tools(version: str = VERSION) -> Path:
    """The folder holding `llama-server` and `llama-quantize` built from the sdist's vendored
    llama.cpp: once per version (tens of minutes on two cores), under the cache lock, into a
    temporary folder renamed into place. `LLAMA_CPP_TOOLS`, when set, names such a folder."""
    supplied = os.environ.get(TOOLS_ENV)
    if supplied:
        return Path(supplied)
    target = cache_dir(version) / TOOLS_DIR
    if all((target / name).is_file() for name in TOOLS):
        return target
    with cache_lock(cache_dir(version)):
        if all((target / name).is_file() for name in TOOLS):
            return target
        temp, root = _unpacked(version, ".tools-")
        built = _build_tools(root / VENDOR, temp / "build")
        (temp / "tools").mkdir()
        for name in TOOLS:
            shutil.copy2(built / name, temp / "tools" / name)
        shutil.rmtree(target, ignore_errors=True)
        (temp / "tools").rename(target)
        shutil.rmtree(temp)
    return target


def built_tools(version: str = VERSION) -> Path | None:
    """The tools' folder where it is built already (or `LLAMA_CPP_TOOLS` names one), else None:
    what the node agent puts on a pod's PATH, never building."""
    supplied = os.environ.get(TOOLS_ENV)
    target = Path(supplied) if supplied else cache_dir(version) / TOOLS_DIR
    return target if all((target / name).is_file() for name in TOOLS) else None


def llama_cpp_env(version: str = VERSION) -> dict[str, str]:
    """Where a pod of the node agent finds llama.cpp, as the trainer image has it at /opt/llama.cpp
    (FINETUNE_LLAMA_CPP, FINETUNE_LLAMA_QUANTIZE): what the cache already holds, nothing built
    here (`python -m hack.llama_cpp converters` unpacks the converters in seconds, `make llama-cpp`
    builds llama-quantize)."""
    root = cache_dir(version)
    env = {}
    if (root / CONVERTERS_DIR / "convert_hf_to_gguf.py").is_file():
        env["FINETUNE_LLAMA_CPP"] = str(root / CONVERTERS_DIR)
    if (root / TOOLS_DIR / "llama-quantize").is_file():
        env["FINETUNE_LLAMA_QUANTIZE"] = str(root / TOOLS_DIR / "llama-quantize")
    return env


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "python"
    if command == "converters":
        print(converters())
    elif command == "python":
        converters()
        print(python_package())
    elif command == "tools":
        print(tools())
    elif command == "sdist":
        print(sdist())
    else:
        print(f"usage: python -m hack.llama_cpp [converters|python|tools|sdist], not {command!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
