"""`ftjob upload` against the real control plane: a restricted pod mounts the claim, the CLI
streams to it through the API server's pod proxy (the node agent's pods have routable
addresses for it), and an upload killed mid-way resumes where it stopped."""

import hashlib
import os
import random
import re
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from kubernetes import client

from tests.fixtures.cluster import Cluster, wait_for
from tests.support.cli import PYTHONPATH, REPO, assert_one_line_error
from tests.support.cli import ftjob_process as ftjob
from tests.support.harness import volume_folder

pytestmark = pytest.mark.cluster

GIB = 1 << 30
MIB = 1 << 20
UPLOAD_PODS = "finetune.dev/component=upload"


@pytest.fixture
def claim(namespace: str, core: client.CoreV1Api) -> str:
    """A claim in a namespace that enforces Pod Security `restricted`, as a team's would."""
    labels = {"pod-security.kubernetes.io/enforce": "restricted"}
    core.patch_namespace(namespace, {"metadata": {"labels": labels}})
    spec = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "2Gi"}}}
    core.create_namespaced_persistent_volume_claim(namespace, {"metadata": {"name": "store"}, "spec": spec})
    return "store"


def random_file(path: Path, size: int) -> str:
    """Incompressible bytes (a seeded generator: os.urandom costs seconds per GiB) and their sha256."""
    digest, source = hashlib.sha256(), random.Random(29)
    with path.open("wb") as handle:
        for _ in range(size // (64 * MIB)):
            block = source.randbytes(64 * MIB)
            digest.update(block)
            handle.write(block)
    return digest.hexdigest()


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(8 * MIB), b""):
            digest.update(block)
    return digest.hexdigest()


def sent_mib(stdout: str) -> float:
    found = re.search(r"sent ([\d.]+) (MiB|GiB) in ([\d.]+) s", stdout)
    assert found, stdout
    return float(found[1]) * (1024 if found[2] == "GiB" else 1)


def settled_size(path: Path, timeout: float = 30) -> int:
    """A file's size once it stops growing: the receiver writes what reached it before it sees the sender gone."""
    last, deadline = -1, time.monotonic() + timeout
    while time.monotonic() < deadline:
        size = path.stat().st_size
        if size == last:
            return size
        last = size
        time.sleep(0.5)
    raise AssertionError(f"{path} still grows after {timeout} s")


def upload_pods(core: client.CoreV1Api, namespace: str) -> list[str]:
    return [p.metadata.name for p in core.list_namespaced_pod(namespace, label_selector=UPLOAD_PODS).items]


def test_a_1_gib_upload_killed_mid_way_resumes_and_lands_with_the_same_sha256(
    cluster: Cluster, namespace: str, claim: str, core: client.CoreV1Api, tmp_path: Path
) -> None:
    local = tmp_path / "big.bin"
    local_sha = random_file(local, GIB)
    folder = volume_folder(REPO, namespace, claim) / "models"
    partial, landed = folder / "big.bin.ftjob-partial", folder / "big.bin"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (PYTHONPATH, os.environ.get("PYTHONPATH")) if p)}
    command = [sys.executable, "-m", "finetune_cli", "upload", str(local), f"{claim}:models/big.bin", "-n", namespace]

    first = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: partial.is_file() and partial.stat().st_size >= 300 * MIB, 120, "300 MiB in the claim")
    finally:
        first.send_signal(signal.SIGKILL)  # no clean-up of any kind: as a lost laptop lid or a kill -9
        first.wait()
    assert first.returncode == -signal.SIGKILL

    cut = settled_size(partial)
    assert 0 < cut < GIB and not landed.exists()
    [left] = upload_pods(core, namespace)  # the killed upload's pod is still there
    # Its port is open on the pod network too, where only a request with the pod's token is heard.
    pod = core.read_namespaced_pod(left, namespace)
    direct = f"http://{pod.status.pod_ip}:{pod.spec.containers[0].ports[0].container_port}/stat?path=models/big.bin"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(direct, timeout=10)
    assert refused.value.code == 403

    started = time.monotonic()
    second = ftjob(*command[3:], timeout=300)
    took = time.monotonic() - started
    assert second.returncode == 0, second.stderr
    assert "reusing upload pod" in second.stderr
    assert "models/big.bin: resuming at" in second.stderr, second.stderr
    # Resumed, not restarted: only what was missing crossed the wire.
    assert sent_mib(second.stdout) == pytest.approx((GIB - cut) / MIB, abs=0.1)
    assert sha256(landed) == local_sha
    assert f"{local_sha}  {claim}:models/big.bin" in second.stdout
    assert not partial.exists()
    wait_for(lambda: not upload_pods(core, namespace) or None, 30, "the upload pod to be removed")
    print(f"\nresumed upload: {second.stdout.splitlines()[-1]} ({took:.1f} s for the whole second run)")


def test_uploaded_files_are_readable_by_the_trainer_uid_and_a_second_upload_skips_them(
    cluster: Cluster, namespace: str, claim: str, tmp_path: Path
) -> None:
    model = tmp_path / "tiny-llama"
    (model / "sub").mkdir(parents=True)
    files = {"config.json": b'{"model_type": "llama"}', "sub/tokenizer.json": b"{}", "empty": b""}
    for name, content in files.items():
        (model / name).write_bytes(content)
        (model / name).chmod(0o600)  # as a shard writer leaves model.safetensors
    (model / "sub").chmod(0o700)

    result = ftjob("upload", str(model), f"{claim}:models/", "-n", namespace, timeout=180)
    assert result.returncode == 0, result.stderr
    landed = volume_folder(REPO, namespace, claim) / "models" / "tiny-llama"
    for name, content in files.items():
        assert (landed / name).read_bytes() == content
    closed = [
        f"{path.relative_to(landed)} {stat.filemode(path.stat().st_mode)}"
        for path in [landed, *landed.rglob("*")]
        if not path.stat().st_mode & stat.S_IROTH or (path.is_dir() and not path.stat().st_mode & stat.S_IXOTH)
    ]
    assert not closed, f"not readable by uid 1000: {closed}"

    again = ftjob("upload", str(model), f"{claim}:models/", "-n", namespace, timeout=180)
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("already in the claim with the same sha256, skipped") == len(files), again.stderr
    assert "sent 0 B" in again.stdout


def test_a_claim_that_does_not_exist_is_one_line_naming_it(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    local = tmp_path / "train.jsonl"
    local.write_text('{"instruction": "x", "output": "y"}\n')
    result = ftjob("upload", str(local), "nope:data/train.jsonl", "-n", namespace)
    assert_one_line_error(result, "persistentvolumeclaim nope not found", namespace)


def test_bad_arguments_are_one_line_naming_them(tmp_path: Path) -> None:
    assert_one_line_error(ftjob("upload", str(tmp_path / "gone"), "store"), f"LOCAL {tmp_path / 'gone'}: no such")
    assert_one_line_error(ftjob("upload", str(tmp_path), "Store:x"), "CLAIM 'Store'")
    assert_one_line_error(ftjob("upload", str(tmp_path), "store:a/../b"), "PATH 'a/../b'")


def test_a_partial_file_that_is_not_the_local_files_start_is_replaced_not_resumed(
    cluster: Cluster, namespace: str, claim: str, tmp_path: Path
) -> None:
    local = tmp_path / "train.jsonl"
    local.write_bytes(b'{"instruction": "a", "output": "b"}\n' * 4096)
    folder = volume_folder(REPO, namespace, claim) / "data"
    folder.mkdir(parents=True)
    (folder / "train.jsonl.ftjob-partial").write_bytes(b"something else entirely")

    result = ftjob("upload", str(local), f"{claim}:data/train.jsonl", "-n", namespace, timeout=180)
    assert result.returncode == 0, result.stderr
    assert "data/train.jsonl: the partial file in the claim is not this file's start; starting over" in result.stderr
    assert "resuming" not in result.stderr
    assert (folder / "train.jsonl").read_bytes() == local.read_bytes()
    assert not (folder / "train.jsonl.ftjob-partial").exists()
