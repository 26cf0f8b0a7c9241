"""Images and allow-list patterns the operator (images.py) and the admission fence (CEL) must
judge alike."""

PATTERNS = ("ghcr.io/finetune-operator/trainer", "registry.example.com/ml/*", "quay.io/team/pinned:1.2")


# (image, allowed by PATTERNS)
CASES: list[tuple[str, bool]] = [
    ("ghcr.io/finetune-operator/trainer:0.1.0", True),
    ("ghcr.io/finetune-operator/trainer@sha256:" + "a" * 64, True),
    ("ghcr.io/finetune-operator/trainer", True),
    ("ghcr.io/finetune-operator/trainer-evil:0.1.0", False),
    ("ghcr.io/finetune-operator/trainerx", False),
    ("ghcr.io/finetune-operator/other:1", False),
    ("registry.example.com/ml/trainer:2", True),
    ("registry.example.com/ml/deep/trainer@sha256:" + "b" * 64, True),
    ("registry.example.com/mlx/trainer:2", False),
    ("registry.example.com/trainer:2", False),
    ("quay.io/team/pinned:1.2", True),
    ("quay.io/team/pinned:1.2@sha256:" + "c" * 64, True),
    ("quay.io/team/pinned:1.3", False),
    ("docker.io/library/python:latest", False),
    ("trainer:latest", False),
]
