"""Fit the planner's speed constants to bench/calibration/measurements.json and report how
well the memory model matches; prints the lines to put into planning/calibration.py.

    PYTHONPATH=api:planner:trainer_image python -m bench.calibration.fit
"""

from __future__ import annotations

import sys

from .compare import MEMORY_TOLERANCE, SPEED_TOLERANCE, compare, load


def main() -> int:
    record = load()
    if record is None:
        print("bench/calibration/measurements.json does not exist yet: run measure.py on a GPU machine first")
        return 1
    runs = [r for r in record["runs"] if "error" not in r]
    if not runs:
        print("no successful runs in measurements.json")
        return 1
    import numpy as np

    comparisons = [compare(run, record) for run in runs]
    # step = peak_seconds / u + memory_seconds + passes * p + hops * h, least squares on the
    # relative error (each row divided by its measured time).
    measured = np.array([c.tokens / c.measured_tokens_per_second for c in comparisons])
    target = measured - np.array([c.memory_seconds for c in comparisons])
    columns = np.array([[c.peak_seconds, c.layer_passes, c.hops] for c in comparisons], dtype=float)
    solution, *_ = np.linalg.lstsq(columns / measured[:, None], target / measured, rcond=None)
    a, b, h = (float(x) for x in solution)
    print(f"GPU {record['gpu']}: FP32 matmul ceiling {record.get('fp32_matmul_tflops')} TFLOP/s measured")
    print(f"COMPUTE_UTILISATION: Final = {1 / a:.3f}")
    print(f"LAYER_PASS_SECONDS: Final = {b:.5f}")
    print(f"DEVICE_HOP_SECONDS: Final = {h:.5f}")
    print()
    print(f"{'run':34} {'memory: measured -> planned (GiB), error':52} {'tokens/s: measured -> planned':30}")
    worst_memory = worst_speed = 0.0
    for c in comparisons:
        memory = ", ".join(
            f"{m:.2f}->{p:.2f} ({e:+.0%})"
            for m, p, e in zip(c.measured_gib, c.predicted_gib, c.memory_errors(), strict=True)
        )
        print(
            f"{c.label:34} {memory:52} {c.measured_tokens_per_second:9.0f} -> {c.predicted_tokens_per_second:9.0f} "
            f"({c.speed_error:+.0%})"
        )
        worst_memory = max([worst_memory, *(abs(e) for e in c.memory_errors())])
        worst_speed = max(worst_speed, abs(c.speed_error))
    print(
        f"\nworst memory error {worst_memory:.0%} (limit {MEMORY_TOLERANCE:.0%}); "
        f"worst speed error with the current constants {worst_speed:.0%} (limit {SPEED_TOLERANCE:.0%})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
