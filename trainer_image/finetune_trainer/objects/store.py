"""A boto3 client for one S3 source, and botocore's errors said as one line naming the field.

Credentials come from the environment only: in a pod, the variables the Job takes from the
Secret the source names (finetune_api.contract.s3_secrets); with `ftjob run`, the usual AWS_*
variables (and the rest of boto3's chain). A source without them is read anonymously.
"""

import os
from dataclasses import dataclass
from typing import Any, Final

import boto3
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)

from finetune_api.contract import S3_FIELDS, S3_INPUT_ROLES, S3_KEY_ENV, S3_OUTPUT_ROLES, s3_secrets, s3_sources
from finetune_api.object_storage import OutputS3, S3Source
from finetune_api.reasons import ExitReason
from finetune_api.spec import FineTuneJobSpec

from ..failures import TrainerFailure

# A store that does not answer is said within seconds, not after minutes of retries: a refused
# or unreachable endpoint is a spec's mistake far more often than a passing outage.
CONNECT_TIMEOUT_S: Final = 5
READ_TIMEOUT_S: Final = 60
ATTEMPTS: Final = 4
DEFAULT_REGION: Final = "us-east-1"
# The pods that fetch hold the inputs' credentials (model, dataset, eval); the trainer's, the output's.
INPUT_ROLES: Final = S3_INPUT_ROLES
OUTPUT_ROLES: Final = S3_OUTPUT_ROLES
# botocore's codes for credentials the store refused, and for a missing bucket or key.
REFUSED_CREDENTIALS: Final = frozenset(
    {"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken", "InvalidClientTokenId"}
)
DENIED: Final = frozenset({"AccessDenied", "403", "Forbidden", "AllAccessDisabled"})
NO_BUCKET: Final = frozenset({"NoSuchBucket"})
NO_KEY: Final = frozenset({"NoSuchKey", "404", "NotFound"})

Source = S3Source | OutputS3


@dataclass(frozen=True)
class Where:
    """A source and the spec field it is written at (spec.model.source.s3, spec.output.s3)."""

    source: Source
    field: str
    env_prefix: str = ""

    def at(self, name: str) -> str:
        return f"{self.field}.{name}"

    @property
    def endpoint_text(self) -> str:
        return self.source.endpoint or "AWS S3"


def wheres(spec: FineTuneJobSpec, roles: tuple[str, ...]) -> list[tuple[str, Where]]:
    """(role, Where) of each of `roles` read from S3, with the environment prefix its credentials
    have in the pod (the same call the operator's builders make)."""
    prefixes = {role: prefix for role, prefix, _ in s3_secrets(spec, roles)}
    sources = s3_sources(spec)  # model, dataset, eval (spec.dataset.eval) and output
    found: list[tuple[str, Where]] = []
    for role in roles:
        source = sources[role]
        if source is not None:
            found.append((role, Where(source, S3_FIELDS[role], prefixes.get(role, ""))))
    return found


def _credentials(where: Where) -> dict[str, str] | None:
    """The source's keys from the environment (its prefix's, else the plain AWS_* of `ftjob run`)."""
    for prefix in dict.fromkeys((where.env_prefix, "")):
        values = [os.environ.get(prefix + name) for name in S3_KEY_ENV]
        if all(values):
            access, secret = values
            assert access is not None and secret is not None
            return {"aws_access_key_id": access, "aws_secret_access_key": secret}
    return None


def client(where: Where, *, pool: int = 10) -> Any:
    """A client of the source's store: path-style addressing (what S3-compatible stores serve),
    standard retries with backoff, checksums only where the protocol requires them (several
    S3-compatible stores refuse the newer default ones); the objects are verified by their ETags."""
    source = where.source
    keys = _credentials(where)
    session = boto3.session.Session(**(keys or {}))
    signed = keys is not None or session.get_credentials() is not None
    config = Config(
        region_name=source.region or DEFAULT_REGION,
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
        retries={"max_attempts": ATTEMPTS, "mode": "standard"},
        s3={"addressing_style": "path" if source.endpoint else "auto"},
        max_pool_connections=pool,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        **({} if signed else {"signature_version": UNSIGNED}),
    )
    return session.client("s3", endpoint_url=source.endpoint.rstrip("/") if source.endpoint else None, config=config)


def code_of(exc: ClientError) -> str:
    error = exc.response.get("Error") or {}
    return str(error.get("Code") or exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or "")


def _credentials_line(where: Where, code: str) -> str:
    secret = where.source.secret_name
    if secret is not None:
        return f"{where.at('secretName')}: {where.endpoint_text} refused the credentials of Secret {secret!r} ({code})"
    # No Secret named, yet the request was signed: `ftjob run` with the usual variables (or
    # boto3's own chain), whose keys are what the user fixes, not a Secret.
    if _credentials(where) is not None or boto3.session.Session().get_credentials() is not None:
        return (
            f"{where.at('secretName')}: {where.endpoint_text} refused the credentials found in the environment "
            f"({', '.join(S3_KEY_ENV)}) ({code})"
        )
    return f"{where.at('secretName')}: {where.endpoint_text} refused anonymous access to bucket " + (
        f"{where.source.bucket!r} ({code}): name a Secret with {' and '.join(S3_KEY_ENV)}"
    )


def refusal(where: Where, exc: BaseException, key: str | None = None) -> TrainerFailure:
    """One line naming the field a user fixes, for what botocore raised (`key`: the object or
    prefix asked for)."""
    source = where.source
    if isinstance(exc, (EndpointConnectionError, ConnectTimeoutError, ConnectionClosedError)):
        why = " ".join(str(exc).split())
        return TrainerFailure(
            ExitReason.InvalidConfig, f"{where.at('endpoint')}: cannot reach {where.endpoint_text}: {why}"
        )
    if isinstance(exc, ReadTimeoutError):
        return TrainerFailure(
            ExitReason.InvalidConfig, f"{where.at('endpoint')}: {where.endpoint_text} stopped answering: {exc}"
        )
    if isinstance(exc, NoCredentialsError):
        return TrainerFailure(ExitReason.InvalidConfig, f"{where.at('secretName')}: no credentials: {exc}")
    if isinstance(exc, ClientError):
        code = code_of(exc)
        if code in NO_BUCKET:
            line = f"{where.at('bucket')}: no bucket {source.bucket!r} at {where.endpoint_text}"
        elif code in NO_KEY:
            line = f"{where.at('key')}: no object {key or source.key!r} in bucket {source.bucket!r}"
        elif code in REFUSED_CREDENTIALS or (code in DENIED and source.secret_name is None):
            line = _credentials_line(where, code)
        elif code in DENIED:
            line = (
                f"{where.at('secretName')}: the credentials of Secret {source.secret_name!r} may not read "
                f"bucket {source.bucket!r} ({code})"
            )
        else:
            line = f"{where.field}: {where.endpoint_text} answered {code}: {exc}"
        return TrainerFailure(ExitReason.InvalidConfig, line)
    if isinstance(exc, BotoCoreError):
        return TrainerFailure(ExitReason.InvalidConfig, f"{where.field}: {type(exc).__name__}: {exc}")
    raise exc
