"""The trainer image allow-list: which `spec.image` values a platform team lets jobs run.

The same rule is checked three times: by the operator (a job outside it ends Failed with
ImageNotAllowed and no Job is made), by `ftjob validate --values` before a job is sent, and at
admission by the chart's fence policy (files/operator-fence-policy.yaml), which refuses such a
Job even if the others were bypassed. Python and CEL must agree, so the rule is kept small
enough to write the same way in both:

- a pattern ending in `*` allows every image that starts with what comes before the `*`
  (`registry.example.com/ml/*`; `*` alone allows everything);
- any other pattern is a repository, allowing it with any tag or digest
  (`ghcr.io/finetune-operator/trainer` allows `...trainer:0.1.0` and `...trainer@sha256:...`),
  or a full reference (`repo:tag`, `repo@sha256:...`), allowing exactly that image (a pinned
  tag pattern also allows the same tag with a digest appended).

Images are compared as written: no registry or `library/` is filled in, so patterns and
`spec.image` should both name the registry.
"""

from collections.abc import Iterable, Sequence

from finetune_api.constants import DEFAULT_IMAGE, DEFAULT_SERVING_IMAGE

WILDCARD = "*"


def repository(image: str) -> str:
    """The image without its tag or digest (a registry port is not a tag)."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > slash else name


DEFAULT_ALLOWED_IMAGES: tuple[str, ...] = (repository(DEFAULT_IMAGE),)
# A ModelServer's images have their own list (the chart's serving.allowedImages), checked the same
# way by the operator and its fence: a token allowed to make servers runs no trainer image there.
DEFAULT_ALLOWED_SERVING_IMAGES: tuple[str, ...] = (repository(DEFAULT_SERVING_IMAGE),)


def pattern_allows(pattern: str, image: str) -> bool:
    if pattern.endswith(WILDCARD):
        return image.startswith(pattern[: -len(WILDCARD)])
    return image == pattern or image.startswith(pattern + ":") or image.startswith(pattern + "@")


def allowed(image: str, patterns: Iterable[str]) -> bool:
    return any(pattern_allows(p, image) for p in patterns)


def pattern_problem(pattern: str) -> str | None:
    """Why a pattern is unusable, or None: a `*` anywhere but at the end would be read literally."""
    if not pattern or pattern != pattern.strip():
        return "empty or surrounded by spaces"
    if WILDCARD in pattern[:-1]:
        return "`*` is allowed only at the end"
    return None


def refusal(image: str, patterns: Sequence[str], kind: str = "trainer") -> str:
    """The one line a user sees on the FineTuneJob (or, `kind` serving, the ModelServer) when its
    image is not allowed."""
    return f"spec.image: {image!r} is not in the {kind} image allow-list ({', '.join(patterns)})"
