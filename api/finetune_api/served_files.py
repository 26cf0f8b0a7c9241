"""What a ModelServer loads: the GGUF files its spec names, found through the namespace's
FineTuneJobs and claims, or the one line per field that says why one cannot be served.

These are the refusals that need other objects than the ModelServer (no message holds a semicolon:
the status joins them with "; "): an adapter whose job has not
Succeeded, did not write gguf-lora, or was trained on another base than the server's (by the
model fingerprint the trainer reports, `status.modelFingerprint`: a hash of the base's
config.json, as its checkpoints record it); a claim the namespace does not have. The operator
runs them before it makes anything (the server ends Failed with the line), and `ftjob validate`
where it reaches the cluster; both hand in the objects as the API server returns them (plain
dicts), so the two read the same facts the same way. Pure: no I/O.

A pod mounts every claim it reads once, read-only, at CLAIMS_MOUNT/<claim>; a job's files are
where its status.output says, on its output claim (mounted at the trainer's OUTPUT_MOUNT there).
"""

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from .contract import OUTPUT_MOUNT
from .problems import Problem
from .server_spec import GgufSource, ModelServerSpec, servable_path

GGUF_LORA: Final = "gguf-lora"
SUCCEEDED: Final = "Succeeded"
CLAIMS_MOUNT: Final = "/mnt/claims"

Body = Mapping[str, Any]


@dataclass(frozen=True)
class Served:
    """One file a server pod loads: the field that names it, its job (if any), its claim and
    its path inside the claim, and the id llama-server gives it (adapters: their order)."""

    field: str
    claim: str
    relative: str
    job: str | None = None
    id: int | None = None
    fingerprint: str | None = None

    @property
    def pod_path(self) -> str:
        return f"{CLAIMS_MOUNT}/{self.claim}/{self.relative}"

    def status(self) -> dict[str, Any]:
        """As status.base and status.adapters[] list it."""
        out: dict[str, Any] = {"claimName": self.claim, "path": self.pod_path}
        if self.id is not None:
            out = {"id": self.id, **out}
        if self.job is not None:
            out["job"] = self.job
        return out


@dataclass
class Resolution:
    base: Served | None = None
    adapters: list[Served] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def claims(self) -> list[str]:
        """Every claim the pods mount, each once, in the order first named."""
        files = [*([self.base] if self.base else []), *self.adapters]
        return list(dict.fromkeys(f.claim for f in files))


def _job_output(job: Body) -> dict[str, Any] | None:
    formats = ((job.get("status") or {}).get("output") or {}).get("formats") or []
    return next((f for f in formats if isinstance(f, dict) and f.get("format") == GGUF_LORA), None)


def _asked_formats(job: Body) -> list[str]:
    return list(((job.get("spec") or {}).get("output") or {}).get("formats") or ["peft"])


def _export_failure(job: Body) -> str | None:
    """The job's own words when its gguf-lora export failed (it Succeeded with its adapter)."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        message = str(condition.get("message") or "")
        if condition.get("type") == "Exported" and condition.get("status") == "False" and GGUF_LORA in message:
            return message
    return None


def _in_claim(pod_path: str) -> str | None:
    prefix = OUTPUT_MOUNT + "/"
    return pod_path[len(prefix) :] if pod_path.startswith(prefix) else None


def _job_refusal(name: str, job: Body | None, namespace: str) -> str | None:
    """Why the job's gguf-lora files cannot be served, or None."""
    if job is None:
        return f"FineTuneJob {name!r} not found in namespace {namespace!r}"
    if GGUF_LORA not in _asked_formats(job):
        listed = ", ".join(_asked_formats(job))
        return (
            f"job {name} does not write {GGUF_LORA} (its spec.output.formats: {listed}), the GGUF adapter and base "
            "a server loads"
        )
    phase = (job.get("status") or {}).get("phase")
    if phase != SUCCEEDED:
        return f"job {name} is {phase or 'not started'}, not {SUCCEEDED}: a server loads only a finished job's files"
    failure = _export_failure(job)
    if failure is not None:
        return f"job {name} did not write {GGUF_LORA} ({failure}), and `ftjob export {name}` writes it"
    return None


def _from_job(field_path: str, source: GgufSource, job: Body | None, namespace: str, base: bool) -> Served | Problem:
    name = str(source.job)
    refusal = _job_refusal(name, job, namespace)
    if refusal is not None:
        return Problem(field_path, refusal)
    assert job is not None
    written = _job_output(job) or {}
    relative = _in_claim(str(written.get("basePath" if base else "path") or ""))
    claim = written.get("claimName")
    if relative is None or not claim:
        return Problem(field_path, f"job {name}'s status.output names no {GGUF_LORA} files on a claim")
    if not servable_path(relative):
        return Problem(field_path, f"job {name}'s {GGUF_LORA} file {relative!r} has a comma or a colon in its path")
    fingerprint = (job.get("status") or {}).get("modelFingerprint")
    return Served(field_path, str(claim), relative, job=name, fingerprint=str(fingerprint) if fingerprint else None)


def _resolve(
    field_path: str, source: GgufSource, jobs: Mapping[str, Body | None], namespace: str, base: bool
) -> Served | Problem:
    if source.pvc is not None:
        return Served(f"{field_path}.pvc", source.pvc.claim_name, source.pvc.path)
    return _from_job(f"{field_path}.job", source, jobs.get(str(source.job)), namespace, base)


def _other_base(resolution: Resolution) -> list[Problem]:
    """Adapters whose job was trained on another base than the reference: the base's job, else the
    first adapter's job with a fingerprint. A file on a claim carries none and is not compared."""
    known = [f for f in [*([resolution.base] if resolution.base else []), *resolution.adapters] if f.fingerprint]
    if not known:
        return []
    reference = known[0]
    return [
        Problem(
            f.field,
            f"job {f.job} was trained on another base than {reference.field.removesuffix('.job')} (job "
            f"{reference.job}): model fingerprint {f.fingerprint} against {reference.fingerprint}",
        )
        for f in resolution.adapters
        if f.fingerprint and f.fingerprint != reference.fingerprint
    ]


def _missing_claims(resolution: Resolution, claims: Collection[str], namespace: str) -> list[Problem]:
    problems = []
    for served in [*([resolution.base] if resolution.base else []), *resolution.adapters]:
        if served.claim in claims:
            continue
        where = f"{served.field}.claimName" if served.job is None else served.field
        owner = "" if served.job is None else f"job {served.job}'s output "
        problems.append(
            Problem(
                where,
                f"{owner}claim {served.claim!r} not found in namespace {namespace!r} (a server mounts only "
                "claims of its own namespace)",
            )
        )
    return problems


def resolve(
    spec: ModelServerSpec, namespace: str, jobs: Mapping[str, Body | None], claims: Collection[str] | None
) -> Resolution:
    """The files the server loads, each adapter with its llama-server id (its place in the list),
    or the problems; `jobs` holds every job the spec names (None: not found), `claims` the names
    of the namespace's claims (None: not known, not checked)."""
    out = Resolution()
    base = _resolve("spec.base", spec.base, jobs, namespace, base=True)
    if isinstance(base, Problem):
        out.problems.append(base)
    else:
        out.base = base
    for index, source in enumerate(spec.adapters):
        found = _resolve(f"spec.adapters[{index}]", source, jobs, namespace, base=False)
        if isinstance(found, Problem):
            out.problems.append(found)
        else:
            out.adapters.append(Served(found.field, found.claim, found.relative, found.job, index, found.fingerprint))
    out.problems += _other_base(out)
    if claims is not None:
        out.problems += _missing_claims(out, claims, namespace)
    return out


def named_jobs(spec: ModelServerSpec) -> list[str]:
    """The FineTuneJobs the spec names, each once."""
    return list(dict.fromkeys(s.job for s in [spec.base, *spec.adapters] if s.job is not None))
