"""The upload pod's program: a tiny HTTP receiver that writes files into the claim it mounts.

It runs as `python3 -c <this file's source> ROOT PORT IDLE_SECONDS` in any image with Python 3.9+,
so it imports only the standard library and nothing of this project (the pod's image need not
carry the project). `ftjob upload` reaches it through the API server's pod proxy, which forwards
plain HTTP; a request carries one file's path relative to ROOT:

  GET  /ping                      {} once it listens
  GET  /stat?path=P[&hash=H]      {"size": of P or null, "partial": of P's partial or null}, with
                                  "sha256" of P for H=final, "partialSha256" of the partial for H=partial
  PUT  /append?path=P&offset=N    append the body to P's partial, which must hold N bytes (409 with its size if not)
  POST /finish?path=P&sha256=H    P's partial has sha256 H: it becomes P (mode 0644); else it is removed (409)
  POST /discard?path=P            remove P's partial (it is not a prefix of the file being sent)
  GET  /read?path=P               P's bytes (`ftjob report` reads report.html, `ftjob compare` evaluation.json);
                                  404 where P is no file
  GET  /list?path=P               {"entries": [{"name", "size" (null: a folder)}]} of folder P ('' the root)

Reads are confined as writes are, and more: a link inside the claim that leads out of it is not
followed (a claim's files are the trainer's and the user's; a link could name the pod's own).

Every request must carry the pod's token (header X-Upload-Token, the pod's FTJOB_UPLOAD_TOKEN):
the API server's proxy lets only those with `pods/proxy` in the namespace through, but the port is
also open on the pod network, where any pod could otherwise write into the claim.

A partial file is written as its bytes arrive, so what reached the claim before an interruption
stays there and the next upload resumes from its size. Files are 0644 and folders 0755 whoever
runs the trainer: readable by its uid, whatever the upload pod's.
"""

import hashlib
import hmac
import http.server
import json
import os
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

PARTIAL_SUFFIX = ".ftjob-partial"
BLOCK = 1 << 20
FILE_MODE, FOLDER_MODE = 0o644, 0o755
TOKEN_HEADER = "X-Upload-Token"
TOKEN = os.environ.get("FTJOB_UPLOAD_TOKEN", "")


class BadPath(ValueError):
    pass


class State:
    root = Path("/data")
    last_request = time.monotonic()


# The sha256 of each partial file this process wrote from its first byte, and how many bytes it
# covers: a finish need not read the whole file again (a file resumed by another pod is read).
DIGESTS: "dict[Path, tuple[int, Any]]" = {}


def resolve(relative: str) -> Path:
    """The file under ROOT that `relative` names; never outside ROOT."""
    parts = relative.split("/")
    if not relative or relative.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise BadPath(f"path {relative!r} must be relative, without '.' or '..' parts")
    return State.root.joinpath(*parts)


def inside(path: Path) -> Path:
    """`path` with its links followed, refused where that leaves ROOT."""
    real, root = path.resolve(), State.root.resolve()
    if real != root and root not in real.parents:
        raise BadPath("path leads out of the claim through a link")
    return real


def listed_size(entry: Path) -> Any:
    """A file's size in a listing; null for a folder, and for a link that leads out of the claim."""
    try:
        return inside(entry).stat().st_size if entry.is_file() else None
    except BadPath:
        return None


def partial_of(path: Path) -> Path:
    return path.with_name(path.name + PARTIAL_SUFFIX)


def size_of(path: Path) -> Any:
    return path.stat().st_size if path.is_file() else None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(BLOCK), b""):
            digest.update(block)
            State.last_request = time.monotonic()
    return digest.hexdigest()


def partial_sha256(partial: Path) -> str:
    held = DIGESTS.get(partial)
    if held is not None and held[0] == size_of(partial):
        return str(held[1].hexdigest())
    return sha256_of(partial)


def make_parents(path: Path) -> None:
    """Create the missing folders above `path` with mode 0755 (mkdir's mode is cut by the umask)."""
    missing = [parent for parent in path.parents if not parent.is_dir()]
    for folder in reversed(missing):
        folder.mkdir(exist_ok=True)
        folder.chmod(FOLDER_MODE)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # one line per request, as a pod log
        sys.stderr.write(f"{self.command} {format % args}\n")

    def reply(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def query(self) -> "dict[str, str]":
        parsed = urllib.parse.urlsplit(self.path)
        return {key: values[0] for key, values in urllib.parse.parse_qs(parsed.query).items()}

    def route(self) -> str:
        return urllib.parse.urlsplit(self.path).path.rstrip("/").rsplit("/", 1)[-1]

    def handle_one_request(self) -> None:
        State.last_request = time.monotonic()
        super().handle_one_request()

    def dispatch(self, routes: "dict[str, Any]") -> None:
        if not hmac.compare_digest(self.headers.get(TOKEN_HEADER, "").encode(), TOKEN.encode()):
            self.close_connection = True
            self.reply(403, {"error": f"no or wrong {TOKEN_HEADER}"})
            return
        action = routes.get(self.route())
        if action is None:
            self.reply(404, {"error": f"no such endpoint: {self.path}"})
            return
        try:
            action(self.query())
        except BadPath as exc:
            self.reply(400, {"error": str(exc)})
        except OSError as exc:
            self.reply(500, {"error": f"{type(exc).__name__}: {exc}"})

    def do_GET(self) -> None:
        self.dispatch({"ping": self.ping, "stat": self.stat_file, "read": self.read_file, "list": self.list_folder})

    def do_PUT(self) -> None:
        self.dispatch({"append": self.append_file})

    def do_POST(self) -> None:
        self.dispatch({"finish": self.finish_file, "discard": self.discard_file})

    def ping(self, query: "dict[str, str]") -> None:
        self.reply(200, {})

    def stat_file(self, query: "dict[str, str]") -> None:
        path = resolve(query.get("path", ""))
        body = {"size": size_of(path), "partial": size_of(partial_of(path))}
        if query.get("hash") == "final" and body["size"] is not None:
            body["sha256"] = sha256_of(path)
        if query.get("hash") == "partial" and body["partial"] is not None:
            body["partialSha256"] = partial_sha256(partial_of(path))
        self.reply(200, body)

    def read_file(self, query: "dict[str, str]") -> None:
        path = inside(resolve(query.get("path", "")))
        if not path.is_file():
            self.reply(404, {"error": "no such file"})
            return
        with path.open("rb") as handle:
            length = os.fstat(handle.fileno()).st_size
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(length))
            self.end_headers()
            while length > 0:
                block = handle.read(min(BLOCK, length))
                if not block:  # the file shrank while it was read: the short body tells the reader
                    self.close_connection = True
                    return
                self.wfile.write(block)
                length -= len(block)
                State.last_request = time.monotonic()

    def list_folder(self, query: "dict[str, str]") -> None:
        wanted = query.get("path", "")
        folder = inside(resolve(wanted) if wanted else State.root)
        if not folder.is_dir():
            self.reply(404, {"error": "no such folder"})
            return
        entries = [{"name": entry.name, "size": listed_size(entry)} for entry in sorted(folder.iterdir())]
        self.reply(200, {"entries": entries})

    def append_file(self, query: "dict[str, str]") -> None:
        partial = partial_of(resolve(query.get("path", "")))
        length = int(self.headers.get("Content-Length") or -1)
        if length < 0:
            self.close_connection = True
            self.reply(411, {"error": "Content-Length required"})
            return
        held = size_of(partial) or 0
        if int(query.get("offset", "-1")) != held:
            self.close_connection = True  # the body is not read: this connection cannot carry another request
            self.reply(409, {"error": "offset differs from the partial file's size", "partial": held})
            return
        make_parents(partial)
        tracked = DIGESTS.pop(partial, None)
        digest = hashlib.sha256() if held == 0 else tracked[1] if tracked and tracked[0] == held else None
        with partial.open("ab") as handle:
            partial.chmod(FILE_MODE)
            while length > 0:
                block = self.rfile.read(min(BLOCK, length))
                if not block:
                    break  # the sender went away: keep what arrived, the next upload resumes from it
                handle.write(block)
                if digest is not None:
                    digest.update(block)
                length -= len(block)
                held += len(block)
                State.last_request = time.monotonic()
        if digest is not None:
            DIGESTS[partial] = (held, digest)
        if length > 0:
            self.close_connection = True
            return
        self.reply(200, {"partial": size_of(partial)})

    def finish_file(self, query: "dict[str, str]") -> None:
        path = resolve(query.get("path", ""))
        partial, expected = partial_of(path), query.get("sha256", "")
        if not partial.is_file():
            # Finished already (the reply to an earlier finish was lost) or never started.
            if path.is_file() and sha256_of(path) == expected:
                self.reply(200, {"size": size_of(path), "sha256": expected})
            else:
                self.reply(404, {"error": "no partial file"})
            return
        actual = partial_sha256(partial)
        DIGESTS.pop(partial, None)
        if actual != expected:
            partial.unlink()
            self.reply(409, {"error": "sha256 differs; the partial file was removed", "sha256": actual})
            return
        partial.chmod(FILE_MODE)
        partial.replace(path)
        self.reply(200, {"size": size_of(path), "sha256": actual})

    def discard_file(self, query: "dict[str, str]") -> None:
        partial = partial_of(resolve(query.get("path", "")))
        DIGESTS.pop(partial, None)
        partial.unlink(missing_ok=True)
        self.reply(200, {})


def stop_when_idle(server: http.server.ThreadingHTTPServer, idle_seconds: float) -> None:
    """An interrupted upload leaves its pod behind: it ends itself once nobody has used it for a while."""
    while time.monotonic() - State.last_request < idle_seconds:
        time.sleep(min(5.0, idle_seconds))
    server.shutdown()


def main(argv: "list[str]") -> int:
    State.root, port, idle = Path(argv[0]), int(argv[1]), float(argv[2])
    if len(TOKEN) < 16:
        sys.stderr.write("FTJOB_UPLOAD_TOKEN must be set (16 characters or more)\n")
        return 2
    os.umask(0o022)
    server = http.server.ThreadingHTTPServer(("", port), Handler)
    threading.Thread(target=stop_when_idle, args=(server, idle), daemon=True).start()
    sys.stderr.write(f"receiving into {State.root} on port {port}\n")
    sys.stderr.flush()
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
