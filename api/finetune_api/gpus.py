"""What the API needs to know about GPU products, as GPU Feature Discovery labels them."""

import re
from typing import Final

# GFD writes `nvidia.com/gpu.product` from the driver's product name with spaces turned into
# dashes: "Tesla-P40", "Tesla-P100-PCIE-16GB", "Quadro-P6000", "NVIDIA-GeForce-GTX-1080-Ti".
# One regex serves both pydantic and the CRD's CEL rule (CEL `matches` uses RE2, which
# accepts this subset), so admission and `ftjob validate` can never disagree.
PASCAL_PRODUCT_PATTERN: Final = (
    "^(NVIDIA-)?(Tesla-P[0-9]+|Quadro-(GP|P)[0-9]+|(GeForce-)?GTX-10[0-9]+|TITAN-Xp?)([-_].*)?$"
)
_PASCAL = re.compile(PASCAL_PRODUCT_PATTERN)


HALF_PRECISIONS: Final = ("bf16", "fp16")


def is_pascal(product: str) -> bool:
    """True for Pascal cards (compute capability 6.x): no bf16, and fp16 AMP breaks the recipe."""
    return _PASCAL.match(product) is not None


def pascal_precision_message(product: str, precision: str) -> str:
    return (
        f"precision {precision} is not supported on {product} (Pascal has no bf16 and fp16 "
        "mixed precision breaks QLoRA there); use precision: fp32 or auto"
    )
