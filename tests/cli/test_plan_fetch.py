"""`ftjob plan`'s fetch line: the bytes an S3 model weighs, from its config, and with
`--fetch-bandwidth` the time its fetch takes before any GPU is asked for (the 70B example)."""

import json

from tests.support.cli import assert_one_line_error, ftjob

EXAMPLE = "examples/llama-3.3-70b-s3.yaml"


def test_the_70b_examples_fetch_is_on_the_plan_with_its_time() -> None:
    done = ftjob("plan", EXAMPLE, "--fetch-bandwidth", "1Gbit/s")
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("fetch ")]
    assert "about 141 GB from s3://models/meta-llama/Llama-3.3-70B-Instruct/ (70.6B parameters in bfloat16)" in line
    # 141 GB at 125 MB/s: 1128 s.
    assert "; about 19 min at 1Gbit/s;" in line
    slower = ftjob("plan", EXAMPLE, "--fetch-bandwidth", "100Mbit/s", "--json")
    assert "about 3.1 h at 100Mbit/s" in json.loads(slower.stdout)["fetch"]


def test_without_a_bandwidth_the_line_says_the_bytes_and_a_claim_job_has_none() -> None:
    done = ftjob("plan", EXAMPLE)
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("fetch ")]
    assert "about 141 GB" in line and " at " not in line.split("bfloat16)")[1]
    claims = ftjob("plan", "examples/llama-3.3-70b-4xp40.yaml")
    assert claims.returncode == 0, claims.stderr
    assert not [line for line in claims.stdout.splitlines() if line.startswith("fetch ")]


def test_a_bandwidth_that_is_no_rate_is_one_line() -> None:
    assert_one_line_error(ftjob("plan", EXAMPLE, "--fetch-bandwidth", "fast"), "--fetch-bandwidth", "1Gbit/s")
