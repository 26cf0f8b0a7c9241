"""The README's GPU table of model families comes from its committed record."""

from bench import families
from tests.support import docs


def test_every_committed_families_record_is_in_the_readme_as_rendered() -> None:
    text = docs.all_text()
    records = families.records()
    assert records, "no families record committed"
    for name, record in records.items():
        assert families.table(record) in text, f"README's table for {name} differs from the record"


def test_the_record_trained_every_family_in_fp32_within_the_plan() -> None:
    """What issue-level acceptance asks of the GPU run: 0 half tensors, every step done, and the
    measured peak within 5% of the plan's allocated part (the same quantity PyTorch reports)."""
    for record in families.records().values():
        for row in record["families"]:
            assert row["ran"] and row["exitCode"] == 0 and row["finalStep"] == record["steps"], row
            assert row["halfTensors"] == 0, row
            assert abs(row["measuredOverPlanAllocated"] - 1) <= 0.05, row
            assert row["measuredPeakGiB"] <= row["planGiB"], row
