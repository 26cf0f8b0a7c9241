"""S3-compatible object storage: list a source's objects, fetch them into the object cache claim
(resumed, verified, reused when their ETags match), and copy a job's outputs to `output.s3`.

Every transfer goes through boto3 (multipart, ranged GETs, retries); nothing of the protocol is
written here. Every failure a user can fix ends as one TrainerFailure naming the spec's field
(`store.refusal`). It stands on `failures` alone, beside `data`: the pre-flight's listing, the
fetch Job, the fingerprint (the objects' ETags) and the upload all read it.
"""
