"""`ftjob plan`'s fetch line: the bytes a job's S3 model weighs and, with `--fetch-bandwidth`, how
long the pre-flight's fetch takes, before any GPU is asked for.

The weight is the checkpoint's as the model's config says it is stored (its parameters times
the bytes of its `torch_dtype`): the plan is made offline, so the store is not asked. A copy
already on the object cache claim with the same ETags is reused and costs no fetch.
"""

import re
from typing import Any, Final

from finetune_api.quantities import describe_bytes
from finetune_api.spec import FineTuneJobSpec

from .errors import CliError

DTYPE_BYTES: Final = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
# Units of --fetch-bandwidth, in bytes per second.
_UNITS: Final = {
    "bit/s": 1 / 8, "kbit/s": 1e3 / 8, "mbit/s": 1e6 / 8, "gbit/s": 1e9 / 8,
    "bps": 1 / 8, "kbps": 1e3 / 8, "mbps": 1e6 / 8, "gbps": 1e9 / 8,
    "b/s": 1, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9, "mib/s": 1 << 20, "gib/s": 1 << 30,
}  # fmt: skip


def bandwidth(text: str | None) -> float | None:
    """Bytes per second of `--fetch-bandwidth` (1Gbit/s, 500MB/s, 10Gbps); None when not given."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z/]+)\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS or float(match.group(1)) <= 0:
        raise CliError(f"--fetch-bandwidth: expected a rate such as 1Gbit/s, 10Gbps or 500MB/s, got {text!r}")
    return float(match.group(1)) * _UNITS[unit]


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def model_bytes(config: dict[str, Any], parameters: int) -> tuple[int, str]:
    """(bytes, how they were reckoned) of the model's checkpoint."""
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    each = DTYPE_BYTES.get(dtype, 2)
    return parameters * each, f"{parameters / 1e9:.1f}B parameters in {dtype}"


def fetch_line(
    spec: FineTuneJobSpec, config: dict[str, Any] | None, parameters: int | None, rate: str | None
) -> str | None:
    """The line, or None for a job that reads nothing from S3."""
    model, data = spec.model.source.s3, spec.dataset.source.s3
    if model is None and data is None:
        return None
    parts = []
    size = 0
    if model is not None and config is not None and parameters:
        size, how = model_bytes(config, parameters)
        parts.append(f"about {describe_bytes(size)} from {model.uri} ({how})")
    elif model is not None:
        parts.append(f"the model from {model.uri}")
    if data is not None:
        parts.append(f"the dataset from {data.uri} (its bytes as the pre-flight lists them)")
    text = "fetch     " + "; ".join(parts)
    per_second = bandwidth(rate)
    if rate is not None and per_second is not None and size:
        text += f"; about {_duration(size / per_second)} at {rate.strip()}"
    return text + "; before the GPUs, and not again while the copy's ETags match"
