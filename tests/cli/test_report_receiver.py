"""The upload pod's receiver reads files back (`ftjob report`, `ftjob compare`): its read and list
routes, run here as the pod runs it (`python3 -c SOURCE ROOT PORT IDLE`), keep the token check and
stay inside the claim, links included."""

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from finetune_cli.upload_pod import TOKEN_ENV, receiver_source
from finetune_cli.upload_receiver import TOKEN_HEADER
from tests.support.harness import free_port, wait_for

TOKEN = "t" * 32


@pytest.fixture(scope="module")
def receiver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("claim")
    (root / "job" / "adapter").mkdir(parents=True)
    (root / "job" / "report.html").write_bytes(b"<html>\x00\xff" * 100_000)  # binary-safe, over one block
    (root / "outside.txt").write_text("claim's own")
    secret = tmp_path_factory.mktemp("pod") / "secret"
    secret.write_text("not the claim's")
    (root / "job" / "leak").symlink_to(secret)
    port = free_port()
    env = {**os.environ, TOKEN_ENV: TOKEN}
    process = subprocess.Popen([sys.executable, "-c", receiver_source(), str(root), str(port), "60"], env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: get(url, "ping")[0] == 200 or None, 20, "the receiver to listen")
        yield url, root
    finally:
        process.terminate()
        process.wait(10)


def get(url: str, route: str, token: str = TOKEN, **query: str) -> tuple[int, bytes]:
    request = urllib.request.Request(f"{url}/{route}?{urllib.parse.urlencode(query)}", headers={TOKEN_HEADER: token})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


def error(reply: tuple[int, bytes]) -> tuple[int, Any]:
    return reply[0], json.loads(reply[1]).get("error")


def test_read_returns_the_files_bytes_and_list_the_folder(receiver: tuple[str, Path]) -> None:
    url, root = receiver
    assert get(url, "read", path="job/report.html") == (200, (root / "job" / "report.html").read_bytes())
    status, body = get(url, "list", path="job")
    assert status == 200
    assert json.loads(body)["entries"] == [
        {"name": "adapter", "size": None},
        {"name": "leak", "size": None},  # a link out of the claim: not even its size
        {"name": "report.html", "size": 800_000},
    ]
    assert [e["name"] for e in json.loads(get(url, "list")[1])["entries"]] == ["job", "outside.txt"]


def test_a_missing_file_is_404_and_reads_stay_inside_the_claim(receiver: tuple[str, Path]) -> None:
    url, _ = receiver
    assert error(get(url, "read", path="job/evaluation.json")) == (404, "no such file")
    assert error(get(url, "read", path="job")) == (404, "no such file")
    assert error(get(url, "list", path="job/report.html")) == (404, "no such folder")
    for bad in ("../outside.txt", "/etc/passwd", "job/../outside.txt", ""):
        assert get(url, "read", path=bad)[0] == 400, bad
    assert error(get(url, "read", path="job/leak")) == (400, "path leads out of the claim through a link")


def test_reads_need_the_pods_token(receiver: tuple[str, Path]) -> None:
    url, _ = receiver
    assert get(url, "read", token="", path="job/report.html")[0] == 403
    assert get(url, "list", token="x" * 32, path="job")[0] == 403
