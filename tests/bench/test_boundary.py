"""The boundary phase's choices and the README's boundary tables, which come from its records."""

from pathlib import Path

from bench import boundary
from tests.support import docs

BENCH_README = Path(__file__).resolve().parents[2] / "bench" / "README.md"


def test_every_committed_boundary_record_is_in_the_readme_as_rendered() -> None:
    text = docs.all_text()
    records = boundary.records()
    assert records, "no boundary record committed"
    for name, record in records.items():
        assert boundary.table(record) in text, f"README's table for {name} differs from the record"


def test_bench_readme_shows_todays_boundary_records_as_rendered() -> None:
    assert (
        boundary.table(boundary.records()["2026-12-02-h200-boundary-calibrated-auto.json"]) in BENCH_README.read_text()
    )
    assert boundary.table(boundary.records()["2026-12-02-h200-boundary-calibrated.json"]) in BENCH_README.read_text()


def test_each_point_is_the_deepest_slice_its_plan_fits_and_six_leave_under_a_gib() -> None:
    """The search's answer fits and one layer more does not; at least six points (the issue's
    count) sit within 1 GiB of the cap. A layer of the 8B shape at 4096 tokens keeps 3.1 GiB, so
    that point's deepest slice may leave more."""
    tight = 0
    for point in boundary.POINTS:
        layers = boundary.deepest(point, 8)
        assert layers > 0, point
        assert boundary.planned(point, layers, 8).fits
        assert not boundary.planned(point, layers + 1, 8).fits
        tight += boundary.planned(point, layers, 8).layout.fullest.headroom < 2**30
    assert tight >= 6


def test_each_auto_point_keeps_some_layers_not_all_and_fits() -> None:
    """The `auto` points stand where all-recompute leaves room: the plan keeps at least one layer
    and leaves at least one to recompute or offload, so they test the sizing, not a corner."""
    for point in boundary.AUTO_POINTS:
        assert point.ckpt == "auto" and point.layers is not None
        assert boundary.deepest(point, 8) == point.layers
        summary = boundary.planned(point, point.layers, 8).summary
        assert 0 < summary["kept_layers"] < point.layers, (point, summary)


def test_the_long_points_fit_at_their_depths_and_the_deepest_needs_its_inputs_in_host_memory() -> None:
    """The `long` phase's slices (issue 38): every one fits its set depth on the fused attention;
    the 70B slice at 8192 tokens fits 8 layers with every input on the GPU and 12 only with the
    recomputing layers' inputs in host memory, which the plan then turns on."""
    for point in boundary.LONG_POINTS:
        assert point.layers is not None
        summary = boundary.planned(point, point.layers, 4).summary
        assert summary["fits"], point
        assert summary["inputs_offloaded"] == (point.width == "70b" and point.seq == 8192 and point.layers > 9), point
    deep = boundary.Point("70b", 8192, True, layers=12)
    assert not boundary.planned(deep, 12, 4, attention="materialised").fits
