"""A job's output folder on its claim, and reading files from it through the API server.

Where: the claim and folder the operator put in status.output (claimName, adapterPath), else the
ones its spec names (contract.output_claim_name and trainer_paths, as the operator computes them)
for a job the operator has not yet reported on. How: the upload pod (upload_session.py) mounts
the claim and its receiver's read route answers through the API server's pod proxy, as `ftjob
upload` writes: no exec, no port-forward, no route to the pod network.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from finetune_api import contract, layout
from finetune_api.spec import FineTuneJobSpec

from . import kube
from .errors import CliError
from .pod_proxy import PodProxy
from .upload_pod import DEFAULT_IMAGE
from .upload_session import UploadTarget, delete_pod, open_session


@dataclass(frozen=True)
class OutputPlace:
    claim: str
    folder: str  # inside the claim, without a leading '/'

    def file(self, name: str) -> str:
        return f"{self.folder}/{name}" if self.folder else name


def _from_status(output: dict[str, Any]) -> OutputPlace | None:
    claim, adapter = output.get("claimName"), output.get("adapterPath")
    if not isinstance(claim, str) or not isinstance(adapter, str):
        return None
    folder = adapter.removesuffix(f"/{layout.ADAPTER_DIR}")
    if folder != contract.OUTPUT_MOUNT and not folder.startswith(contract.OUTPUT_MOUNT + "/"):
        return None
    return OutputPlace(claim, folder.removeprefix(contract.OUTPUT_MOUNT).strip("/"))


def output_place(job: dict[str, Any]) -> OutputPlace:
    """The claim and folder the job writes its output into."""
    name = str(job["metadata"]["name"])
    reported = _from_status((job.get("status") or {}).get("output") or {})
    if reported is not None:
        return reported
    try:
        spec = FineTuneJobSpec.model_validate(job.get("spec") or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise CliError(f"finetunejob {name}: spec.{where}: {first['msg']}") from None
    folder = str(contract.trainer_paths(name, spec, lambda _role, _claim: "", "")["output"])
    return OutputPlace(contract.output_claim_name(name, spec), folder.strip("/"))


def add_reader_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--image",
        default=DEFAULT_IMAGE,
        metavar="IMAGE",
        help=f"the image of the pod that reads the claim: any with python3 (default {DEFAULT_IMAGE})",
    )
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=180.0,
        metavar="SECONDS",
        help="how long the pod that reads the claim may take to start (default 180)",
    )


@dataclass(frozen=True)
class ClaimReader:
    proxy: PodProxy
    claim: str

    def read(self, path: str) -> bytes | None:
        """The file's bytes; None where the claim holds no such file."""
        reply, data = self.proxy.read("read", {"path": path})
        if reply.status == 404 and "error" in reply.body:
            return None
        if reply.status != 200:
            raise CliError(f"claim {self.claim}, path {path!r}: {reply.error}")
        return data


@contextmanager
def claim_reader(cluster: kube.Cluster, claim: str, args: argparse.Namespace) -> Iterator[ClaimReader]:
    """A reader of `claim`; the pod started for it goes afterwards (one found running, from an
    upload under way, is left to it: it ends itself once idle)."""
    proxy, reused = open_session(cluster, UploadTarget(claim, args.image, args.start_timeout))
    try:
        yield ClaimReader(proxy, claim)
    finally:
        if not reused:
            delete_pod(cluster, proxy.pod)
