"""S3-compatible object storage in the spec: a source of the model or the dataset, the place a
job's outputs are copied to, and the claim fetched objects are kept on.

Where teams keep models and data (S3, or MinIO, Ceph RGW and the like on premises). The objects
are fetched by the CPU pre-flight before any GPU is asked for, into a claim (`objectCache`), and
read from there by the trainer; a second job on the same objects, unchanged (same ETags), fetches
nothing. Credentials come from a Secret of the namespace with the standard access-key fields,
given by reference to the pods that fetch and upload, never read by the operator.
"""

from typing import Annotated, Final

from pydantic import ConfigDict, Field

from .base import ApiModel, ResourceName

# S3's rule for bucket names (lower case, digits, dots and hyphens, 3 to 63 characters).
BUCKET_PATTERN: Final = r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$"
# A key is a path the fetched copy mirrors on the claim: no leading slash, no empty, "." or ".."
# segment (a prefix ends in one slash). S3 allows any key; a job reads these.
_SEGMENT: Final = r"(\.{3,}|[^/]*[^/.][^/]*)"
KEY_PATTERN: Final = rf"^{_SEGMENT}(/{_SEGMENT})*/?$"
PREFIX_PATTERN: Final = rf"^({_SEGMENT}/)+$"
# http(s)://host[:port], no path: the store's address (path-style requests are made on it).
ENDPOINT_PATTERN: Final = r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?/?$"
REGION_PATTERN: Final = r"^[a-z0-9-]{1,32}$"
# The keys of the Secret `secretName` names, as AWS's tools spell them; the pods get them as
# environment variables of the same names, by reference.
ACCESS_KEY_FIELDS: Final = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
MODEL_NEEDS_PREFIX: Final = "a model is a folder: s3.key must be a prefix ending in /"
# The claim the operator makes, once per namespace, for the objects its jobs fetch (unless a job
# names its own in objectCache.claimName).
NAMESPACE_CACHE_CLAIM: Final = "finetune-object-cache"

Key = Annotated[str, Field(min_length=1, max_length=1024, pattern=KEY_PATTERN)]
Prefix = Annotated[str, Field(min_length=2, max_length=1024, pattern=PREFIX_PATTERN)]


class _Store(ApiModel):
    bucket: Annotated[str, Field(min_length=3, max_length=63, pattern=BUCKET_PATTERN)] = Field(
        description="The bucket."
    )
    endpoint: Annotated[str, Field(max_length=256, pattern=ENDPOINT_PATTERN)] | None = Field(
        default=None,
        description="The store's address, http(s)://host[:port], for S3-compatible stores (MinIO, Ceph RGW); "
        "unset: AWS S3. The platform's NetworkPolicy must let the pods that fetch and upload reach it "
        "(the chart's trainer.networkPolicy.objectStorage).",
    )
    region: Annotated[str, Field(max_length=32, pattern=REGION_PATTERN)] | None = Field(
        default=None, description="The bucket's region (AWS S3); unset: us-east-1, which S3-compatible stores accept."
    )
    secret_name: ResourceName | None = Field(
        default=None,
        description="A Secret of the namespace holding the credentials under the standard keys "
        f"{' and '.join(ACCESS_KEY_FIELDS)}. It reaches only the pods that fetch and upload, as environment "
        "variables from the Secret; the operator never reads it. Unset: anonymous requests (a public bucket).",
    )


class S3Source(_Store):
    """Objects of an S3-compatible bucket, fetched into the object cache claim before any GPU is asked for."""

    key: Key = Field(
        description="One object (a dataset file), or a prefix ending in / (a model folder, a dataset folder): "
        "every object under it, at its path relative to the prefix."
    )

    @property
    def is_prefix(self) -> bool:
        return self.key.endswith("/")

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


class OutputS3(_Store):
    """Where the job copies what it wrote (adapter, formats, report, summary) after it ends well."""

    model_config = ConfigDict(title="OutputS3")

    key: Prefix = Field(description="A prefix ending in /: the output folder's files land under it, by their path.")

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


class ObjectCacheSpec(ApiModel):
    claim_name: ResourceName | None = Field(
        default=None,
        description="A claim of the namespace to keep fetched objects on (mounted read-write by the fetch, "
        f"read-only by the trainer). Unset: {NAMESPACE_CACHE_CLAIM}, which the operator makes once per namespace, "
        "sized from the objects the first job lists, and every job of the namespace shares (a copy whose ETags "
        "match is reused, not fetched again). A job whose objects the claim cannot hold fails before any GPU Job.",
    )
