"""Every measured figure of the README and bench/README.md, held to the committed record it
came from (bench/results/ and bench/results/reliability/): a figure that disagrees with its
record, or a record the text leaves out, fails here.

The figures are phrased here from the records, the way the README writes them, and looked up
in its text; the results table is compared whole with `python -m bench.table`'s rendering.
"""

import json
import re
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bench.table import HEADER, render
from tests.reliability.test_operator_chaos import kill_modes
from tests.support import docs

REPO = Path(__file__).resolve().parents[2]
README = docs.all_text()  # README.md and docs/*.md
BENCH_README = (REPO / "bench" / "README.md").read_text(encoding="utf-8")
RESULTS = REPO / "bench" / "results"
RELIABILITY = RESULTS / "reliability"


def record(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RELIABILITY / name).read_text())
    return data


def flat(text: str) -> str:
    """The text with its line breaks and runs of spaces as single spaces (the README wraps)."""
    return re.sub(r"\s+", " ", text)


def assert_stated(phrase: str, text: str = README) -> None:
    if flat(phrase) not in flat(text):
        pytest.fail(f"not in the text as the record says: {phrase!r}")


# --- the GPU results table -----------------------------------------------------------------


def test_readme_table_is_bench_table_rendering() -> None:
    start = README.index(HEADER)
    end = README.index("\n\n", start)
    assert README[start:end] == render()


# --- bench/README.md's measured table ------------------------------------------------------


def _bench_rows() -> list[list[str]]:
    section = BENCH_README[BENCH_README.index("## Measured") :]
    table = section[section.index("\n| ") + 1 : section.index("\n\n", section.index("\n| "))]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()[2:]]


def _peaks_cell(ours: dict[str, Any]) -> str:
    peak = ours["peak_gib"][0]
    plan = next(iter(ours["plan"].values()))
    each = " each" if len(ours["peak_gib"]) > 1 else ""
    return f"{peak:.2f}{each}; {plan:.2f}"


def test_bench_readme_rows_are_their_records() -> None:
    named = set()
    for _run, cell, reference, ref_tok_s, ours_tok_s, ratio, peaks in _bench_rows():
        name = cell.strip("`")
        data = json.loads((RESULTS / name).read_text())
        named.add(name)
        assert ref_tok_s == f"{data['reference']['tok_s']:.1f}", (name, ref_tok_s)
        assert ours_tok_s == f"{data['ours']['tok_s']:.1f}", (name, ours_tok_s)
        assert ratio == f"{data['ratio']:.3f}x", (name, ratio)
        assert peaks == _peaks_cell(data["ours"]), (name, peaks)
        if split := re.search(r"split over 2: ([0-9.]+)", reference):
            assert split.group(1) == f"{data['reference_split_same_call']['tok_s']:.1f}", name
    # A comparison is ours against the reference; a record of ours alone (the streamed loader's) is
    # held to its own paragraph (test_the_streamed_loader_paragraph_is_its_record).
    comparisons = {
        p.name
        for p in RESULTS.glob("*.json")
        if "tok_s" in (json.loads(p.read_text()).get("ours") or {}) and json.loads(p.read_text()).get("reference")
    }
    assert comparisons - named == set(), "comparison records bench/README.md does not list"


def test_the_no_checkpointing_figure_is_its_record() -> None:
    data = json.loads((RESULTS / "2026-11-30-h200-1gpu-run2.json").read_text())
    ours = data["ours_no_checkpointing"]
    (peak,) = ours["peak_gib"]
    planned = ours["plan"]["cuda:0"]
    stated = f"Without gradient checkpointing, 1 GPU: {ours['tok_s']:.1f} tok/s, {peak:.2f} GiB (planner {planned})"
    assert_stated(stated, BENCH_README)


def _table_records() -> list[dict[str, Any]]:
    named = {row[1].strip("`") for row in _bench_rows()}
    return [json.loads((RESULTS / name).read_text()) for name in sorted(named)]


def test_the_measured_headings_fp32_peak_is_its_records() -> None:
    """The heading's FP32 peak range is the lowest and highest peak the table's records measured."""
    peaks = [peak for data in _table_records() for peak in data.get("fp32_peak_tflops") or []]
    assert_stated(f"FP32 peak {min(peaks):.1f}-{max(peaks):.1f} TFLOP/s", BENCH_README)


def test_the_flop_count_is_bench_flops() -> None:
    """The GFLOP per token the text gives is what `bench.flops` computes, and the records used it."""
    data = json.loads((RESULTS / "2026-11-30-h200-1gpu.json").read_text())
    assert_stated(f"{data['flops_per_token'] / 1e9:.2f} GFLOP per token on the slice at {data['seq']}", BENCH_README)


def test_the_per_layer_table_is_the_layer_memory_record() -> None:
    """Each cell of bench/README's per-layer table, from the allocator figures of its record."""
    data = json.loads((RESULTS / "2026-11-30-h200-layer-memory.json").read_text())
    by_seq = {p["seq"]: p for p in data["per_seq"]}
    gib = 2**30

    def row(label: str, key: str) -> str:
        return f"| {label} | {by_seq[1024][key] / gib:.3f} GiB | {by_seq[2048][key] / gib:.3f} GiB |"

    weights = data["layer_weights_bytes"] / gib
    assert_stated(
        f"| NF4 weights + constants + LoRA of one layer | {weights:.3f} GiB | {weights:.3f} GiB |", BENCH_README
    )
    assert_stated(row("kept per layer with checkpointing (its input)", "input_bytes"), BENCH_README)
    assert_stated(row("kept per layer without checkpointing", "saved_full_bytes"), BENCH_README)
    assert_stated(row("forward transient, no checkpointing", "forward_peak_bytes"), BENCH_README)
    assert_stated(
        row("recompute + backward transient of one checkpointed layer", "backward_peak_ckpt_bytes"), BENCH_README
    )
    assert_stated(row("lm_head + cross-entropy + backward transient", "head_peak_bytes"), BENCH_README)
    assert data["embed_bytes"] == data["lm_head_bytes"]
    assert_stated(f"| embedding (fp32), lm_head (fp32) | {data['embed_bytes'] / gib:.3f} GiB each |", BENCH_README)


def test_the_recompute_records_are_their_tables_and_sentences() -> None:
    """bench/README's recompute tables are `bench.recompute.table` of the records; the sentences
    give today's 8B auto run's figures from its record, the bytes moved from the trainer's
    committed log, and the earlier record's figures that still stand (the 70B slice)."""
    from bench.recompute import table

    data = json.loads((RESULTS / "2026-12-02-h200-recompute-calibrated.json").read_text())
    before = json.loads((RESULTS / "2026-12-02-h200-recompute.json").read_text())
    assert table(data).strip() in BENCH_README and table(before).strip() in BENCH_README
    (eight,) = [s for s in data["shapes"] if s["shape"] == "8b"]
    (slice70,) = [s for s in before["shapes"] if s["shape"] == "70b-4l"]
    runs = {r["run"]: r for r in eight["runs"]}
    auto, every = runs["auto"], runs["allRecompute"]
    assert_stated(
        f"`auto` kept {auto['keptLayers']} of {eight['layers']} layers and offloaded the other "
        f"{auto['offloadedLayers']}: {auto['tokPerS']} against {every['tokPerS']} tokens/s all-recompute "
        f"({eight['ratio']:.3f}x; planned {eight['plannedRatio']:.3f}x), peak {auto['measuredPeakGiB']} GiB "
        f"against a plan of {auto['planAllocatedGiB']} GiB allocated"
    )
    assert_stated(
        f"`auto` kept {auto['keptLayers']} layers and offloaded the other {auto['offloadedLayers']}", BENCH_README
    )
    assert_stated(f"made {eight['ratio']:.3f}x (planned {eight['plannedRatio']:.3f}x)", BENCH_README)
    assert_stated(f"uncapped: {slice70['ratio']:.3f}x (planned {slice70['plannedRatio']:.3f}x)", BENCH_README)
    assert_stated(f"measured / plan allocated {auto['measuredOverPlanAllocated']}", BENCH_README)
    assert auto["lossLast"] == every["lossLast"]  # "the same loss, to every digit"
    log = (RESULTS / "logs" / "2026-12-02-h200-recompute-calibrated-8b-auto.log").read_text()
    line = re.search(r"offload: (\d+) layers, ([\d.]+) GiB to host memory per forward \(([\d.]+) GiB per layer\)", log)
    assert line is not None and int(line[1]) == auto["offloadedLayers"]
    assert_stated(
        f"offload: {line[1]} layers, {line[2]} GiB to host memory per forward ({line[3]} GiB per layer)", BENCH_README
    )
    assert_stated(f"The trainer moved {line[3]} GiB per offloaded layer per forward", BENCH_README)


def test_the_preference_benchmark_is_its_record() -> None:
    """docs/benchmarks.md's table against TRL's DPOTrainer: every cell from the dpo record, the
    ratio and ours' share of the plan, TRL's bf16 casts, and the issue's bars (1.0x, 0.90-1.00)."""
    data = json.loads((RESULTS / "2026-12-05-h100-80gb-hbm3-dpo.json").read_text())
    trl, ours, orpo = data["trl"], data["ours"], data["ourOrpo"]
    assert_stated(f"| TRL `DPOTrainer` | {trl['pairs_s']} | {trl['step_s']} | {trl['peak_gib'][0]} | - | - |")
    for label, run in (("ours, `method: dpo`", ours), ("ours, `method: orpo` (no TRL run beside it)", orpo)):
        cells = (run["pairsPerS"], run["stepS"], run["measuredPeakGiB"], run["planAllocatedGiB"])
        assert_stated(f"| {label} | " + " | ".join(str(c) for c in cells) + f" | {run['measuredOverPlanAllocated']} |")
        assert run["halfTensors"] == 0 and run["exitCode"] == 0
    assert_stated(
        f"Ours makes **{data['ratio']:.3f}x** TRL's pairs per second, and peaks at "
        f"{ours['measuredOverPlanAllocated']} of its own plan"
    )
    assert_stated(f"TRL cast the {trl['half_params_cast_by_trl']['count']} LoRA matrices to bf16")
    assert trl["half_params"] == []  # put back before its first step
    assert data["ratio"] >= 1.0 and 0.90 <= ours["measuredOverPlanAllocated"] <= 1.00
    assert_stated("`bench/results/2026-12-05-h100-80gb-hbm3-dpo.json`")
    log = (RESULTS / "logs" / "2026-12-05-h100-dpo-gpu-tests.log").read_text()
    assert "test_gpu_preference.py" in log and " failed" not in log and "passed" in log


def test_the_auto_boundary_points_are_their_record() -> None:
    """bench/README's table of today's `auto` points at the edge is `bench.boundary.table` of its
    record: no OOM, every run through its steps."""
    from bench.boundary import table

    data = json.loads((RESULTS / "2026-12-02-h200-boundary-calibrated-auto.json").read_text())
    assert table(data).strip() in BENCH_README
    assert data["points"] and not any(p["oom"] for p in data["points"])
    assert sum(p["gradientCheckpointing"] == "auto" for p in data["points"]) == 2
    assert all(p["finalStep"] == data["steps"] for p in data["points"])


# --- the reliability soak ------------------------------------------------------------------


def _x(value: float) -> str:
    return f"{value:.2f}x"


def load_ratios(data: dict[str, Any]) -> str:
    """Every round's CR-to-Job ratios to the floor, then the medians the soak judges."""
    rounds = data["rounds"]
    p50 = " / ".join(_x(r["latency_p50_ratio"]) for r in rounds)
    p99 = " / ".join(_x(r["latency_p99_ratio"]) for r in rounds)
    median50 = statistics.median(r["latency_p50_ratio"] for r in rounds)
    median99 = statistics.median(r["latency_p99_ratio"] for r in rounds)
    assert (median50, median99) == (data["latency_p50_ratio"], data["latency_p99_ratio"])
    return f"per round p50 {p50}, p99 {p99}: median {_x(median50)} and {_x(median99)}"


@pytest.mark.parametrize("day", ["2026-11-30", "2026-12-01"])
def test_load_soak_every_round_is_stated(day: str) -> None:
    assert_stated(load_ratios(record(f"{day}-load-500.json")))


def test_the_one_round_load_run_is_its_record() -> None:
    data = record("2026-11-30-load-500-make-soak-one-round.json")
    ours, floor = data["ours"], data["floor"]
    assert_stated(
        f"p50 {ours['p50_s']} s against {floor['p50_s']} s ({data['latency_p50_ratio']}x), "
        f"p99 {ours['p99_s']} s against {floor['p99_s']} s ({data['latency_p99_ratio']}x)"
    )


@pytest.mark.parametrize("day", ["2026-12-04", "2026-12-05"])
def test_the_leader_chaos_soak_is_its_record(day: str) -> None:
    data = record(f"{day}-leader-chaos-500x20.json")
    assert data["kills"] == 20 and data["takeovers_over_limit"] == 0
    assert data["jobs_created"] == data["jobs"] == 500 and data["duplicate_jobs"] == data["stuck"] == 0
    assert_stated(f"every takeover within {data['takeover_max_s']} s of the kill (median {data['takeover_median_s']} s")
    assert_stated(f"every job terminal {data['seconds_to_all_terminal']} s after the start")


def test_the_fleet_load_soak_is_its_record() -> None:
    data = record("2026-12-04-load-500-coalesced-since-last-write.json")
    per_job = [r["ours"]["requests_per_job"] for r in data["rounds"]]
    assert_stated(f"{min(per_job)}-{max(per_job)} API requests per job")
    patches = [r["ours"]["requests_per_job_by_kind"]["patch FineTuneJob/status"] for r in data["rounds"]]
    events = [r["ours"]["requests_per_job_by_kind"]["create Event"] for r in data["rounds"]]
    assert_stated(f"{min(patches)}-{max(patches)} status patches, {min(events)}-{max(events)} Events")
    floor_p99 = statistics.median(r["floor"]["p99_s"] for r in data["rounds"])
    ours_p99 = statistics.median(r["ours"]["p99_s"] for r in data["rounds"])
    assert_stated(f"{data['p99_to_floor_median']}x the floor's median round ({ours_p99} s against {floor_p99} s)")


def test_the_load_soak_after_the_cuts_is_its_record() -> None:
    data = record("2026-12-05-load-500-namespace-policies-trouble-events.json")
    rounds = [r["ours"] for r in data["rounds"]]
    per_job = [r["requests_per_job"] for r in rounds]
    assert max(per_job) <= 4.0 and all(r["jobs_finished"] == 500 and r["duplicates"] == 0 for r in rounds)
    assert_stated(f"{min(per_job)}-{max(per_job)} API requests per job")
    kinds = [r["requests_per_job_by_kind"] for r in rounds]
    patches = [k["patch FineTuneJob/status"] for k in kinds]
    lease = [k["update Lease"] for k in kinds]
    assert_stated(f"{min(patches)}-{max(patches)} status patches, {min(lease)}-{max(lease)} Lease")
    assert all(k.get("create Event", 0) == 0 and k.get("create NetworkPolicy", 0) == 0 for k in kinds)
    floor_p99 = statistics.median(r["floor"]["p99_s"] for r in data["rounds"])
    ours_p99 = statistics.median(r["p99_s"] for r in rounds)
    assert_stated(f"{data['p99_to_floor_median']}x the floor's median round ({ours_p99} s against {floor_p99} s)")
    assert_stated(f"the p50 ratios' median, {data['latency_p50_ratio']}x")


def test_the_load_soak_after_the_event_on_kopfs_loop_is_its_record() -> None:
    data = record("2026-12-05-load-500-event-on-kopf-loop.json")
    rounds = [r["ours"] for r in data["rounds"]]
    per_job = [r["requests_per_job"] for r in rounds]
    assert max(per_job) <= 4.0 and all(r["jobs_finished"] == 500 and r["duplicates"] == 0 for r in rounds)
    assert all(r["floor"]["jobs_finished"] == 500 and r["floor"]["duplicates"] == 0 for r in data["rounds"])
    assert data["p99_to_floor_median"] <= 1.0
    assert_stated(f"{min(per_job)}-{max(per_job)} API requests per job")
    kinds = [r["requests_per_job_by_kind"] for r in rounds]
    patches = [k["patch FineTuneJob/status"] for k in kinds]
    assert_stated(f"{min(patches)}-{max(patches)} status patches")
    assert_stated(f"Ours' p99 CR-to-Job {' / '.join(str(r['p99_s']) for r in rounds)}")
    assert_stated(f"against the floor's {' / '.join(str(r['floor']['p99_s']) for r in data['rounds'])} s")
    floor_p99 = statistics.median(r["floor"]["p99_s"] for r in data["rounds"])
    ours_p99 = statistics.median(r["p99_s"] for r in rounds)
    assert_stated(f"{data['p99_to_floor_median']}x the floor's median round ({ours_p99} s against {floor_p99} s)")
    assert_stated(f"the p50 ratios' median {data['latency_p50_ratio']}x; RSS {data['rss_ratio']}x")
    machine = data["machine"]
    assert_stated(f"load average {machine['load_average_start'][0]} at the start, {machine['load_average_end'][0]}")


def test_the_fleet_soak_is_its_record() -> None:
    data = record("2026-12-05-fleet-5000.json")
    run = data["run"]
    assert run["completed"] and run["jobs_created"] == run["jobs_finished"] == run["terminal"] == 5000
    assert run["duplicates"] == 0 and "restart" not in data
    assert_stated(f"all 5,000 submitted in {run['submit_s']} s")
    assert_stated(f"all {run['succeeded']:,} Succeeded {run['all_terminal_s']} s after the first create")
    assert_stated(f"{run['peak_rss_mib']} MiB peak RSS and {run['cpu_s']} s of CPU")
    patches = run["requests_per_job_by_kind"]["patch FineTuneJob/status"]
    assert_stated(f"{run['requests_per_job']} API requests per job ({patches} status patches)")


@pytest.mark.parametrize("name", ["2026-12-05-fleet-5000-resync.json", "2026-12-05-fleet-5000-lists-as-bytes.json"])
def test_a_fleet_soak_with_the_resync_is_its_record(name: str) -> None:
    data = record(name)
    run, restart = data["run"], data["restart"]
    assert run["completed"] and run["jobs_created"] == run["jobs_finished"] == run["terminal"] == 5000
    assert run["duplicates"] == 0 and restart["status_writes"] == 0 and restart["all_reconciled_s"] < 300
    assert_stated(f"all 5,000 submitted in {run['submit_s']} s")
    assert_stated(f"all {run['succeeded']:,} Succeeded {run['all_terminal_s']} s after the first create")
    assert_stated(f"{run['peak_rss_mib']} MiB peak RSS and {run['cpu_s']} s of CPU")
    patches = run["requests_per_job_by_kind"]["patch FineTuneJob/status"]
    assert_stated(f"{run['requests_per_job']} API requests per job ({patches} status patches)")
    assert_stated(f"led {restart['process_ready_s']} s after its start and had reconciled every one")
    assert_stated(f"{restart['all_reconciled_s']} s after it (the bound is 300 s), with {restart['requests']} requests")
    assert restart["metrics_scrapes_over_5s"] == 0
    assert_stated(f"{restart['cpu_s']} s of CPU, and {restart['peak_rss_mib']} MiB peak RSS")
    loads = [p["load_1m"] for p in run["progress"]]
    assert_stated(f"load average {min(loads)} to {max(loads)} at the run's samples")


@pytest.mark.parametrize("day", ["2026-11-30", "2026-12-01"])
def test_operator_chaos_mix_and_outcome(day: str) -> None:
    data = record(f"{day}-operator-chaos-50x20.json")
    modes = kill_modes(data["kill_log"])
    assert_stated(f"{modes['sigkill']} SIGKILLs and {modes['hook_exit']} hook exits")
    assert data["job_created_events_over_1"] == 0 and data["duplicate_children"] == 0
    assert_stated(f"all terminal {round(data['seconds_to_all_terminal'])} s after the first kill")


@pytest.mark.parametrize("day", ["2026-11-30", "2026-12-01"])
def test_fuzz_admission(day: str) -> None:
    data = record(f"{day}-fuzz-admission-1000.json")
    assert_stated(
        f"{data['accepted']} admitted and reconciled within {data['seconds_to_reconcile_all']} s of the last "
        f"submission, {data['rejected']} refused at admission"
    )
    assert data["operator_errors"] == data["drift"] == data["unreconciled"] == 0


def test_fuzz_phases_of_the_first_run() -> None:
    phases = record("2026-11-30-fuzz-admission-1000.json")["phases"]
    assert_stated(
        f"{phases['Pending']} Pending, {phases['Queued']} Queued, {phases['Suspended']} Suspended, "
        f"{phases['Failed']} Failed with a reason"
    )


@pytest.mark.parametrize("day", ["2026-11-30", "2026-12-01"])
def test_trainer_chaos(day: str) -> None:
    data = record(f"{day}-trainer-chaos-20.json")
    assert_stated(f"{data['survived']}/{data['kills']} survived")
    assert_stated(f"(max abs diff {data['adapter_max_abs_difference']}); {round(data['seconds'])} s")
    modes = Counter(a["mode"] for a in data["attempts"])
    if day == "2026-11-30":
        assert_stated(
            f"{modes['in-save']} inside checkpoint writes (each torn folder discarded), {modes['random']} past"
        )
        resumed = ", ".join(
            str(a["resumed_from"]).replace("None", "none") for a in data["attempts"] if a["mode"] == "random"
        )
        assert_stated(f"resumed from steps {resumed}")
    else:
        assert_stated(
            f"{modes['in-save']} SIGKILLs inside a checkpoint write, {modes['random']} at a random moment, "
            f"{modes['term-in-save']} double SIGTERMs inside a write"
        )


@pytest.mark.parametrize(
    "name", ["2026-11-30-apiserver-restart-5-gap150.json", "2026-12-01-apiserver-restart-5-gap150.json"]
)
def test_apiserver_restarts(name: str) -> None:
    rounds = record(name)["rounds"]
    converge = [r["converge_s"] for r in rounds]
    lag = [r["operator_lag_s"] for r in rounds]
    text = flat(README)
    for low, high in ((min(converge), max(converge)), (min(lag), max(lag))):
        assert f"{low} to {high} s" in text or f"{low}-{high} s" in text, (name, low, high)


def test_apiserver_outage_range() -> None:
    """The outage the README's row names spans every round of the three restart records."""
    names = [
        "2026-11-30-apiserver-restart-5-gap150.json",
        "2026-12-01-apiserver-restart-5-gap150.json",
        "2026-11-30-apiserver-restart-3-gap0.json",
    ]
    outages = [r["outage_s"] for name in names for r in record(name)["rounds"]]
    assert_stated(f"({min(outages)} to {max(outages)} s outage each)")


def test_apiserver_back_to_back() -> None:
    data = record("2026-11-30-apiserver-restart-3-gap0.json")
    converge = ", ".join(str(r["converge_s"]) for r in data["rounds"])
    assert_stated(f"{converge} s, again 0.0 to {data['max_operator_lag_s']} s of operator lag")


# --- the planner's figure for the 32-layer row ---------------------------------------------

SLICE_32 = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "num_hidden_layers": 32,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}


def test_the_32_layer_rows_one_card_figure_is_todays_planner(tmp_path: Path) -> None:
    """The README says the 32-layer slice does not fit one 22.4 GiB card, with the planner's
    figure: today's planner, on the bench's own spec (bench/trainer_job.py) on one P40."""
    import subprocess
    import sys

    import yaml

    from bench.trainer_job import spec_for

    spec = spec_for(seq=2048, steps=6, gpus=1)
    spec["model"]["source"]["pvc"]["path"] = "slice"
    spec["resources"]["gpuProduct"] = "Tesla-P40"
    job = {"apiVersion": "finetune.dev/v1alpha1", "kind": "FineTuneJob", "metadata": {"name": "s32"}, "spec": spec}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    (tmp_path / "config.json").write_text(json.dumps(SLICE_32))
    command = [sys.executable, "-m", "finetune_cli", "plan", str(tmp_path / "job.yaml")]
    command += ["--model-config", str(tmp_path / "config.json"), "--json"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    plan = json.loads(out.stdout)
    assert plan["fits"] is False and plan["gpu_memory_gib"] == 22.4, plan["message"]
    total = max(g["total_gib"] for g in plan["per_gpu"])
    assert_stated(
        "a model one 22.4 GiB card cannot train "
        f"(today's planner, for the bench's spec on one such card: {total:.1f} GiB)"
    )


def test_the_fsdp_loading_figures_are_the_40_layer_record() -> None:
    ours = json.loads((RESULTS / "2026-11-30-h200-2gpu-40l-fsdp.json").read_text())["ours"]
    seconds, anon, resident = (
        ours["loadSeconds"],
        ours["peakHostAnonGiBPerProcess"][0],
        ours["peakHostGiBPerProcess"][0],
    )
    for text in (README, BENCH_README):
        assert_stated(f"{round(seconds)} s from start to sharded", text)
        assert_stated(f"{anon:.1f} GiB", text)
        assert_stated(f"{resident:.1f} GiB", text)


def test_the_bit_identical_claim_points_to_its_gpu_run() -> None:
    name = "2026-12-01-h200-gpu-quantise.json"
    data = json.loads((RESULTS / name).read_text())
    assert data["bit_identical"] is True and data["exit_code"] == 0, data
    assert data["command"] == "python tests/trainer/test_gpu_quantise.py"
    for text in (README, BENCH_README):
        assert_stated("bit-identical to those quantised on the GPU and kept there", text)
        assert_stated(name, text)


def test_the_streamed_loader_paragraph_is_its_record() -> None:
    data = json.loads((RESULTS / "2026-12-01-h200-1gpu-16l-streamed.json").read_text())
    rank = data["streamed_loader"]["ranks"][0]
    ours = data["ours"]
    text = " ".join(BENCH_README.split())
    for figure in (
        f"built the model in {rank['streamedSeconds']} s with {rank['streamedAnonPeakGiB']} GiB",
        f"({rank['anonAtStartGiB']} GiB at its start)",
        f"against {rank['beforeSeconds']} s and {rank['beforeAnonPeakGiB']} GiB",
        f"({rank['compared']} parameters,",
        f"{len(rank['differences'])} differences; {rank['bytesRead']:,} bytes",
        f"{ours['tok_s']} tok/s, load {ours['loadSeconds']} s, {ours['peakHostAnonGiBPerProcess'][0]} GiB",
    ):
        assert figure in text, figure
    assert rank["bytesRead"] == data["streamed_loader"]["checkpointTensorBytes"]
    assert data["streamed_gpu_test"]["passed"] is True


def test_the_serving_paragraph_is_its_record() -> None:
    """bench/README.md's serving figures, each from the serving record, and the record's own
    claim that both forms answer PEFT's greedy tokens."""
    name = "2026-12-07-h100-80gb-hbm3-serving.json"
    data = json.loads((RESULTS / name).read_text())
    assert data["adapter"]["greedyEqualsPeft"] and data["merged"]["greedyEqualsPeft"]
    assert data["adapter"]["greedy"] == data["merged"]["greedy"] == data["peftGreedy"][: len(data["merged"]["greedy"])]
    speeds = {
        form: {run["concurrency"]: run["tokPerS"] for run in data[form]["runs"]} for form in ("adapter", "merged")
    }
    assert_stated(f"`bench/results/{name}`, CUDA architecture {data['cudaArchitecture']}", BENCH_README)
    assert_stated(f"the build {data['build']['buildSeconds']} s", BENCH_README)
    assert_stated(
        f"{speeds['adapter'][1]} tokens/s for one request and {speeds['adapter'][8]} tokens/s for 8 concurrent; "
        f"the merged GGUF {speeds['merged'][1]} and {speeds['merged'][8]}",
        BENCH_README,
    )


def test_the_grpo_benchmark_is_its_record() -> None:
    """bench/README.md's GRPO paragraph against TRL's GRPOTrainer: each figure from the grpo
    record, and the issue's bars (1.0x, 0.90-1.00, no half tensor)."""
    data = json.loads((RESULTS / "2026-12-07-h100-80gb-hbm3-grpo.json").read_text())
    ours, trl = data["ours"], data["trl"]
    assert_stated(
        f"ours {ours['promptsPerS']} prompts per second against TRL's {trl['prompts_s']}, **{data['ratio']:.3f}x**",
        BENCH_README,
    )
    assert_stated(
        f"our peak {ours['measuredPeakGiB']} GiB against a plan allocated of {ours['planAllocatedGiB']}, "
        f"{ours['measuredOverPlanAllocated']}; {ours['halfTensors']} half tensors",
        BENCH_README,
    )
    assert data["ratio"] >= 1.0 and 0.90 <= ours["measuredOverPlanAllocated"] <= 1.00 and ours["halfTensors"] == 0
    assert data["passed"] is True


def test_the_evaluation_benchmark_is_its_record() -> None:
    """bench/README.md's evaluation paragraph: each part's measured and planned seconds and ratio."""
    data = json.loads((RESULTS / "2026-12-07-h100-80gb-hbm3-evaluation.json").read_text())
    measured, plan, ratio = data["measured"], data["plan"], data["ratio"]
    assert_stated(f"took {measured['tuned']} s against {plan['tuned']} planned ({ratio['tuned']})", BENCH_README)
    assert_stated(f"the base pass {measured['base']} s against {plan['base']} ({ratio['base']})", BENCH_README)
    assert_stated(f"{measured['total']} s against {plan['total']} ({ratio['total']})", BENCH_README)
    assert data["withinBand"] is (abs(ratio["total"] - 1.0) <= data["band"])
