"""`python -m finetune_trainer --self-check`: is this image able to train on this node's GPUs?

A wrong wheel installs without complaint and fails an hour in (torch 2.8 from PyPI has no
sm_6x code at all); this check fails in seconds with what is wrong and what to do.
"""

import logging
from typing import Any

from finetune_api.reasons import ExitReason

from ..failures import TrainerFailure

log = logging.getLogger(__name__)

PASCAL_ARCHES = ("sm_60", "sm_61")
MIN_CAPABILITY = (6, 0)  # NF4 and the 8-bit optimizers need sm_60+


def _runnable(capability: tuple[int, int], arches: list[str]) -> bool:
    """Binary code sm_XY runs on the same major at minor >= Y; PTX compute_XY JIT-compiles for newer."""
    for arch in arches:
        kind, _, digits = arch.partition("_")
        if not digits.isdigit():
            continue
        built = (int(digits[:-1]), int(digits[-1]))
        if kind == "sm" and built[0] == capability[0] and built[1] <= capability[1]:
            return True
        if kind == "compute" and built <= capability:
            return True
    return False


def check_gpu_stack() -> dict[str, Any]:
    """Facts about torch / CUDA / bitsandbytes; raises TrainerFailure(UnsupportedHardware) on a mismatch."""
    import torch

    facts: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpus": []}
    if not torch.cuda.is_available():
        facts["note"] = "no CUDA device visible: GPU checks skipped (CPU jobs only)"
    else:
        arches = torch.cuda.get_arch_list()
        facts["archList"] = arches
        pascal_visible = any(torch.cuda.get_device_capability(i)[0] == 6 for i in range(torch.cuda.device_count()))
        if pascal_visible and not any(arch in arches for arch in PASCAL_ARCHES):
            # The image exists for Pascal; a torch without sm_60/61 code is the wrong wheel.
            raise TrainerFailure(
                ExitReason.UnsupportedHardware,
                f"torch {torch.__version__} was built without Pascal code (arch list: {', '.join(arches) or 'empty'}); "
                "install torch 2.7.1 from the cu118 index first",
            )
        for index in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(index)
            name = torch.cuda.get_device_name(index)
            facts["gpus"].append({"index": index, "name": name, "capability": f"{major}.{minor}"})
            if (major, minor) < MIN_CAPABILITY:
                raise TrainerFailure(
                    ExitReason.UnsupportedHardware,
                    f"cuda:{index} {name} has compute capability {major}.{minor}; NF4 and 8-bit optimizers need 6.0+",
                )
            arch = f"sm_{major}{minor}"
            if not _runnable((major, minor), arches):
                raise TrainerFailure(
                    ExitReason.UnsupportedHardware,
                    f"torch {torch.__version__} has no kernels for cuda:{index} {name} ({arch}); built for "
                    f"{', '.join(arches)}. Use the image's torch 2.7.1+cu118 (the last build with Pascal code)",
                )
    try:
        import bitsandbytes as bnb
        import bitsandbytes.functional as bnbf
    except Exception as exc:
        raise TrainerFailure(ExitReason.UnsupportedHardware, f"bitsandbytes does not load: {exc}") from None
    facts["bitsandbytes"] = bnb.__version__
    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        sample = torch.randn(64, 64, device=device)
        packed, state = bnbf.quantize_4bit(sample, quant_type="nf4", compress_statistics=True)
        error = (bnbf.dequantize_4bit(packed, state) - sample).abs().mean().item()
    except Exception as exc:
        raise TrainerFailure(
            ExitReason.UnsupportedHardware, f"bitsandbytes NF4 fails on {device}: {str(exc).splitlines()[0]}"
        ) from None
    facts["nf4RoundTripError"] = round(error, 4)
    return facts
