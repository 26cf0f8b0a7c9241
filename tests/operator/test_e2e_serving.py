"""A ModelServer end to end on the local cluster: two tiny jobs trained on the same base with
different data (gguf-lora), one server with both adapters, run by the node agent as llama-server
built from the pinned sdist (hack/llama_cpp.py), reached through the API server's service proxy.

- `ftjob chat` with each adapter gives that adapter's greedy tokens, equal to the PEFT model's on
  the same prompt (transformers + peft on the CPU, greedy), and without one the base's.
- `ftjob eval` runs lm-evaluation-harness tasks against it: one table of the base and both adapters.
- Appending a third adapter rolls the pods: every request sent during the roll is answered.
- What the operator refuses (an adapter's job not Succeeded, without gguf-lora, trained on another
  base; a claim of another namespace) it says in one line naming the field, as `ftjob validate`
  says it; the server created while its jobs still trained becomes Ready once they Succeeded.
- Deleting the server removes its Deployment, Service, NetworkPolicy and pods; jobs and claims stay.

The two jobs are trained once for the module (about a minute each on two cores).
"""

import json
import re
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from finetune_api.constants import GROUP, SERVER_PLURAL, VERSION
from finetune_cli import kube as cli_kube
from finetune_cli.chat import post
from finetune_trainer.outputs.gguf_export import CONVERTERS_ENV
from hack import llama_cpp as pinned
from tests.support import steps
from tests.support.cli import REPO, assert_one_line_error, ftjob_process
from tests.support.harness import NO_INPUT_CHECK, Jobs, OperatorProcess, wait_for
from tests.support.install import make_claim, wait_bound
from tests.support.specs import body as spec_body
from tests.support.training import host_path, trainer_hooks

pytestmark = [pytest.mark.cluster, pytest.mark.trainer, pytest.mark.llama_cpp, pytest.mark.timeout(1800)]

PROMPT = "What sound does a cow make?"
NEW_TOKENS = 8
# Each job learns one answer to every question: the two adapters answer differently, and both
# otherwise than the base.
ANSWERS = {"moo": "A cow says moo.", "colours": "red, green, blue."}
QUESTIONS = ["What sound does a cow make?", "Give the opposite of the word. hot", "Repeat the colours. red blue"]
TRAINING = {"maxSteps": 12, "batchSize": 4, "gradientAccumulation": 1, "maxLength": 64, "learningRate": 5e-3}


def _server(name: str, base: str, adapters: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ModelServer",
        "metadata": {"name": name},
        "spec": {
            "base": {"job": base},
            "adapters": adapters,
            "resources": {"gpus": 0, "cpu": "1", "memory": "1Gi"},
            "contextSize": 512,
            "parallel": 2,
        },
    }


@dataclass
class Served:
    namespace: str
    api: client.ApiClient
    folders: dict[str, Path]
    jobs: Jobs
    operator: OperatorProcess
    kubeconfig: Path
    # What `ftjob validate` and the operator said of the server while job `moo` still trained.
    while_training: tuple[str, str]

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    def server(self, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, SERVER_PLURAL, name
            )
            return found
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def status(self, name: str) -> dict[str, Any]:
        return (self.server(name) or {}).get("status") or {}

    def wait(self, name: str, phase: str, timeout: float) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            status = self.status(name)
            return status if status.get("phase") == phase else None

        return wait_for(check, timeout, f"modelserver {name} {phase} (now {self.status(name)}); operator log:\n"
                        f"{self.operator.tail(3000)}")  # fmt: skip

    def create(self, body: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, SERVER_PLURAL, body)

    def ftjob(self, *args: str, timeout: float = 120) -> Any:
        return ftjob_process(*args, "-n", self.namespace, env={"KUBECONFIG": str(self.kubeconfig)}, timeout=timeout)

    def proxy(self, service: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return post(cli_kube.Cluster(self.api, self.namespace), service, path, body)


def _messages(path: Path, answer: str) -> Path:
    rows = [
        {
            "messages": [
                {"role": "user", "content": q + ("" if i < 3 else f" ({i})")},
                {"role": "assistant", "content": answer},
            ]
        }
        for i, q in enumerate(QUESTIONS * 22)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    path.chmod(0o644)
    return path


def _volumes(core: client.CoreV1Api, cluster: Any, namespace: str, root: Path) -> dict[str, Path]:
    from finetune_trainer.model.tiny_model import make_tiny_model

    folders: dict[str, Path] = {}
    for claim in ("models", "datasets", "outputs"):
        make_claim(core, namespace, claim)
    for claim in ("models", "datasets", "outputs"):
        wait_bound(core, namespace, claim)
        folders[claim] = Path(cluster.volume_dir(namespace, claim))
        wait_for(folders[claim].is_dir, 30, f"the folder of PVC {claim}")
    # Llama 2's kind of tokenizer: the one llama.cpp's converter reads (gguf-lora converts the base).
    make_tiny_model(root / "tiny-llama", llama_tokenizer=True)
    shutil.copytree(root / "tiny-llama", folders["models"] / "tiny-llama")
    for name, answer in ANSWERS.items():
        _messages(folders["datasets"] / f"{name}.jsonl", answer)
    return folders


def _job(name: str) -> dict[str, Any]:
    return spec_body(
        model={"source": {"pvc": {"claimName": "models", "path": "tiny-llama"}}},
        dataset={"source": {"pvc": {"claimName": "datasets", "path": f"{name}.jsonl"}}, "format": "messages"},
        output={"pvc": {"claimName": "outputs"}, "formats": ["gguf-lora"], "samples": {"count": 0}},
        training=TRAINING,
        checkpoints={"everySteps": 12, "keep": 2},
    )


def _refused_while_training(served: Served, tmp: Path) -> tuple[str, str]:
    """The pair's server, created while job `moo` trains: what `ftjob validate` and the operator say."""
    served.jobs.wait_phase("moo", "Running", 300)
    manifest = tmp / "pair.yaml"
    body = _server("pair", "moo", [{"job": "moo"}, {"job": "colours"}])
    manifest.write_text(json.dumps(body))
    validated = served.ftjob("validate", str(manifest))
    assert validated.returncode == 1, validated.stdout + validated.stderr
    served.create(body)
    status = served.wait("pair", "Failed", 60)
    return validated.stdout, str(status.get("message"))


def _account(core: client.CoreV1Api, namespace: str) -> bool:
    """Pods are refused until the ServiceAccount controller has made `default`."""
    try:
        core.read_namespaced_service_account("default", namespace)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


@pytest.fixture(scope="module")
def served(
    cluster: Any,
    kube: client.ApiClient,
    operator_kubeconfig: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:
    """A namespace with the two jobs trained and their server `pair` Ready (refused while they trained)."""
    core = client.CoreV1Api(kube)
    namespace = f"serving-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace, "labels": {"finetune.dev/test": "true"}}})
    wait_for(lambda: _account(core, namespace), 30, "the default ServiceAccount")
    tmp = tmp_path_factory.mktemp("serving")
    with steps.timed("llama.cpp: llama-server and llama-quantize (built where not cached)"):
        pinned.tools()
    folders = _volumes(core, cluster, namespace, tmp)
    operator = OperatorProcess(operator_kubeconfig, namespace, tmp / "operator.log", NO_INPUT_CHECK).start()
    jobs = Jobs(kube, namespace)
    try:
        for name in ANSWERS:
            trainer_hooks(core, namespace, name, **{CONVERTERS_ENV: str(pinned.converters())})
            jobs.create(name, _job(name))
        served = Served(namespace, kube, folders, jobs, operator, Path(cluster.kubeconfig), ("", ""))
        served.while_training = _refused_while_training(served, tmp)
        for name in ANSWERS:
            assert jobs.wait_phase(name, ("Succeeded", "Failed"), 600)["phase"] == "Succeeded", jobs.status(name)
        served.wait("pair", "Ready", 180)
        yield served
    finally:
        operator.stop()
        core.delete_namespace(namespace, propagation_policy="Background")


def test_refused_while_its_jobs_train_then_ready_once_they_succeeded(served: Served) -> None:
    said, status = served.while_training
    line = "spec.adapters[0].job: job moo is Running, not Succeeded: a server loads only a finished job's files"
    assert any(said_line.endswith(f"pair.yaml: {line}") for said_line in said.splitlines()), said
    assert line in status.split("; "), status
    ready = served.status("pair")
    assert ready["phase"] == "Ready" and ready["readyReplicas"] == 1
    assert [(a["id"], a["job"]) for a in ready["adapters"]] == [(0, "moo"), (1, "colours")]
    fingerprints = {served.jobs.status(name).get("modelFingerprint") for name in ANSWERS}
    assert len(fingerprints) == 1 and None not in fingerprints, fingerprints


# --- greedy tokens against PEFT ------------------------------------------------------------------


def _peft_greedy(served: Served, adapter: str | None) -> tuple[str, list[int], list[int]]:
    """(the prompt as the chat template renders it, its ids, the greedy continuation's ids) of the
    base with the job's trained adapter (None: the base alone), in float32 on the CPU."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = served.folders["models"] / "tiny-llama"
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(prompt)["input_ids"]
    model: Any = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32).eval()
    if adapter is not None:
        folder = host_path(served.folders, served.jobs.status(adapter)["output"]["adapterPath"])
        model = PeftModel.from_pretrained(model, str(folder)).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=tokenizer.eos_token_id
        )
    new = [int(t) for t in out[0][len(ids) :]]
    return prompt, ids, [t for t in new if t != tokenizer.eos_token_id]


def test_each_adapter_answers_with_its_peft_tokens_and_none_with_the_bases(served: Served) -> None:
    service = "pair-server"
    said: dict[str | None, list[int]] = {}
    for adapter in (*ANSWERS, None):
        args = ["chat", "pair", PROMPT, "--max-tokens", str(NEW_TOKENS), "-o", "tokens"]
        done = served.ftjob(*args, *(["--adapter", adapter] if adapter else []))
        assert done.returncode == 0, done.stderr
        said[adapter] = [int(t) for t in done.stdout.split()]
        prompt, ids, expected = _peft_greedy(served, adapter)
        # The server renders and tokenizes the chat as Hugging Face does: the comparison is of the weights.
        assert served.proxy(service, "apply-template", {"messages": [{"role": "user", "content": PROMPT}]}) == {
            "prompt": prompt
        }
        tokenized = served.proxy(service, "tokenize", {"content": prompt, "add_special": True, "parse_special": True})
        assert tokenized["tokens"] == ids
        assert said[adapter] == expected, (adapter, said[adapter], expected)
    assert len({tuple(t) for t in said.values()}) == 3, said
    text = served.ftjob("chat", "pair", PROMPT, "--adapter", "moo", "--max-tokens", str(NEW_TOKENS))
    assert text.returncode == 0 and text.stdout.strip(), text.stderr
    print(f"\ngreedy answers: {said}; moo says {text.stdout.strip()!r}")


# --- ftjob eval: lm-evaluation-harness against the server -----------------------------------------
# The example task folder (examples/eval-tasks: a cow task and a colours task, generate_until,
# exact match and chrF), run against `pair` while it serves the two adapters: one table of the base
# and both; each adapter scores its own task above the base, and the figures are
# lm-evaluation-harness's on the answers the server gives (chrF equal to sacrebleu's on the same
# answers, fetched again with `lora` as the relay sets it).

TASKS = REPO / "examples" / "eval-tasks"


def _questions() -> dict[str, tuple[list[str], list[str]]]:
    """Task name -> (questions, references), read from the example's data files."""
    found: dict[str, tuple[list[str], list[str]]] = {}
    for task, data in (("cow_sound", "cow.jsonl"), ("colours", "colours.jsonl")):
        docs = [json.loads(line) for line in (TASKS / data).read_text().splitlines() if line.strip()]
        found[task] = ([d["question"] for d in docs], [d["answer"] for d in docs])
    return found


def _answer(served: Served, question: str, lora: list[dict[str, Any]]) -> str:
    """The server's greedy answer, asked as lm-evaluation-harness asks (the template's settings)."""
    body = {"model": "pair", "messages": [{"role": "user", "content": question}], "max_tokens": 32,
            "temperature": 0, "stop": ["\n"], "lora": lora}  # fmt: skip
    return str(served.proxy("pair-server", "v1/chat/completions", body)["choices"][0]["message"]["content"])


def test_one_table_of_the_base_and_both_adapters_each_best_on_its_own_task(served: Served) -> None:
    import sacrebleu

    started = time.monotonic()
    done = served.ftjob("eval", "pair", "--tasks", str(TASKS), "-o", "json", timeout=600)
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said["columns"] == [{"name": "base"}, {"name": "moo", "adapter": 0}, {"name": "colours", "adapter": 1}]
    cells = {(r["task"], r["metric"]): r["values"] for r in said["rows"]}
    assert sorted(cells) == [("colours", "chrf"), ("colours", "exact_match"), ("cow_sound", "chrf"),
                             ("cow_sound", "exact_match")]  # fmt: skip
    assert {r["samples"] for r in said["rows"]} == {2}
    for task, best in (("cow_sound", "moo"), ("colours", "colours")):
        chrf = cells[task, "chrf"]
        assert chrf[best] > chrf["base"] and chrf[best] > max(v for k, v in chrf.items() if k != best), (task, chrf)
    # lm-evaluation-harness's figures on the server's answers: chrF as sacrebleu scores them.
    answers: dict[str, dict[str, list[str]]] = {}
    for column, lora in (("base", []), ("moo", [{"id": 0, "scale": 1.0}]), ("colours", [{"id": 1, "scale": 1.0}])):
        for task, (questions, references) in _questions().items():
            answers.setdefault(column, {})[task] = [_answer(served, q, lora) for q in questions]
            expected = sacrebleu.corpus_chrf(answers[column][task], [references]).score
            assert cells[task, "chrf"][column] == pytest.approx(expected), (column, task, answers[column][task])
    print(f"\nftjob eval: {seconds:.1f} s for 3 runs of 2 tasks; answers {answers}; table {said['rows']}")
    table = served.ftjob("eval", "pair", "--tasks", str(TASKS), "--adapter", "colours", "--limit", "1", timeout=300)
    assert table.returncode == 0, table.stderr
    cells_of = [re.split(r"\s{3,}", line) for line in table.stdout.splitlines()]
    assert cells_of[0] == ["TASK", "METRIC", "N", "BASE", "colours"], table.stdout
    assert len(cells_of) == 5 and all(len(row) == 5 and row[2] == "1" for row in cells_of[1:]), table.stdout


def test_what_is_refused_is_one_line(served: Served, tmp_path: Path) -> None:
    unknown = served.ftjob("eval", "pair", "--tasks", str(TASKS), "--adapter", "baa")
    assert_one_line_error(unknown, "modelserver pair serves no adapter 'baa' (its adapters: 0 (moo), 1 (colours))")
    missing = served.ftjob("eval", "nosuch", "--tasks", str(TASKS))
    assert_one_line_error(missing, "modelserver nosuch")
    broken = tmp_path / "tasks"
    broken.mkdir()
    (broken / "bad.yaml").write_text("task: x\noutput_type: [generate_until\n")
    refused = served.ftjob("eval", "pair", "--tasks", str(broken))
    assert_one_line_error(refused, f"error: {broken / 'bad.yaml'}: line 3: ")


def test_a_task_folder_on_a_claim_is_read_through_the_upload_pod(served: Served) -> None:
    """pvc:CLAIM/PATH: copied through the upload pod's read routes, then read as a local folder;
    a refusal names the file on the claim."""
    shutil.copytree(TASKS, served.folders["datasets"] / "eval-tasks")
    broken = served.folders["datasets"] / "eval-broken"
    shutil.copytree(TASKS, broken)
    (broken / "colours.yaml").write_text((TASKS / "colours.yaml").read_text() + "metric_list: [\n")
    for folder in (served.folders["datasets"] / "eval-tasks", broken):
        for path in [folder, *folder.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
    args = ("--adapter", "moo", "--limit", "1", "-o", "json")
    done = served.ftjob("eval", "pair", "--tasks", "pvc:datasets/eval-tasks", *args, timeout=400)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert [c["name"] for c in said["columns"]] == ["base", "moo"]
    assert sorted((r["task"], r["metric"], r["samples"]) for r in said["rows"]) == [
        ("colours", "chrf", 1), ("colours", "exact_match", 1), ("cow_sound", "chrf", 1), ("cow_sound", "exact_match", 1)
    ]  # fmt: skip
    refused = served.ftjob("eval", "pair", "--tasks", "pvc:datasets/eval-broken", *args, timeout=400)
    line = assert_one_line_error(refused, "error: pvc:datasets/eval-broken/colours.yaml: line ")
    assert "/tmp" not in line, line


# --- a roll ------------------------------------------------------------------------------------


def _rolled(served: Served, adapters: int) -> bool:
    pods = client.CoreV1Api(served.api).list_namespaced_pod(served.namespace, label_selector="finetune.dev/server=pair")
    status = served.status("pair")
    progressing = next((c for c in status.get("conditions") or [] if c["type"] == "Progressing"), {})
    return (
        len(pods.items) == 1
        and len(status.get("adapters") or []) == adapters
        and progressing.get("reason") == "Rolled"
        and status.get("phase") == "Ready"
    )


def test_adding_a_third_adapter_rolls_the_server_and_every_request_is_answered(served: Served) -> None:
    """The third adapter is a GGUF file on a claim (the moo job's, named by path). Requests go out
    on four threads from the patch until the roll has ended and at least 100 were sent."""
    moo = served.status("pair")["adapters"][0]["path"].removeprefix("/mnt/claims/outputs/")
    body = {"model": "pair", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 2, "temperature": 0,
            "lora": [{"id": 1, "scale": 1.0}]}  # fmt: skip
    answered: list[float] = []
    refused: list[str] = []
    done = threading.Event()

    def send() -> None:
        while not done.is_set():
            try:
                reply = served.proxy("pair-server", "v1/chat/completions", body)
                assert reply["choices"][0]["message"]["content"] is not None
                answered.append(time.monotonic())
            except Exception as exc:  # counted, and the test fails naming it
                refused.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=send, daemon=True) for _ in range(4)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    patch = {"spec": {"adapters": [{"job": "moo"}, {"job": "colours"}, {"pvc": {"claimName": "outputs", "path": moo}}]}}
    served.custom.patch_namespaced_custom_object(GROUP, VERSION, served.namespace, SERVER_PLURAL, "pair", patch)
    wait_for(lambda: _rolled(served, 3) and len(answered) + len(refused) >= 100, 240, "the roll and 100 requests")
    rolled_at = time.monotonic()
    done.set()
    for thread in threads:
        thread.join(60)
    print(f"\nroll: {len(answered)} answered, {len(refused)} refused in {rolled_at - started:.1f} s")
    assert not refused, refused[:3]
    assert len(answered) >= 100
    third = served.ftjob("chat", "pair", PROMPT, "--adapter", "2", "--max-tokens", str(NEW_TOKENS), "-o", "tokens")
    first = served.ftjob("chat", "pair", PROMPT, "--adapter", "moo", "--max-tokens", str(NEW_TOKENS), "-o", "tokens")
    assert third.returncode == 0 and third.stdout == first.stdout, (third.stderr, first.stdout)


# --- refusals ------------------------------------------------------------------------------------


def _refused_jobs(served: Served) -> None:
    """A job that failed (its image is off the allow-list), one that writes no gguf-lora, and one
    whose trainer reported another base (its status written as a trainer on another base writes it)."""
    off_list = "docker.io/someone/trainer:1"
    served.jobs.create("failed", {**_job("moo"), "image": off_list})
    plain = _job("moo")
    served.jobs.create("plain", {**plain, "image": off_list, "output": {**plain["output"], "formats": ["peft"]}})
    served.jobs.create("elsewhere", {**_job("moo"), "image": off_list})
    for name in ("failed", "plain", "elsewhere"):
        served.jobs.wait_phase(name, "Failed", 60)
    trained = served.jobs.status("moo")
    status = {
        "phase": "Succeeded",
        "conditions": [{"type": "Complete", "status": "True", "reason": "Succeeded", "message": "trained"}],
        "output": trained["output"],
        "message": None,
        "modelFingerprint": "f" * 16,
    }
    served.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, served.namespace, "finetunejobs", "elsewhere", {"status": status}
    )
    served.jobs.wait_phase("elsewhere", "Succeeded", 30)


def test_refusals_name_the_field_in_ftjob_validate_and_the_status(
    served: Served, kube: client.ApiClient, tmp_path: Path
) -> None:
    _refused_jobs(served)
    core = client.CoreV1Api(kube)
    other = f"serving-other-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": other, "labels": {"finetune.dev/test": "true"}}})
    try:
        make_claim(core, other, "theirs")
        adapters = [
            {"job": "failed"},
            {"job": "plain"},
            {"job": "elsewhere"},
            {"pvc": {"claimName": "theirs", "path": "adapter.gguf"}},
        ]
        body = _server("refused", "moo", adapters)
        expected = [
            "spec.adapters[0].job: job failed is Failed, not Succeeded: a server loads only a finished job's files",
            "spec.adapters[1].job: job plain does not write gguf-lora (its spec.output.formats: peft), the GGUF "
            "adapter and base a server loads",
            f"spec.adapters[2].job: job elsewhere was trained on another base than spec.base (job moo): model "
            f"fingerprint {'f' * 16} against {served.jobs.status('moo')['modelFingerprint']}",
            f"spec.adapters[3].pvc.claimName: claim 'theirs' not found in namespace '{served.namespace}' (a server "
            "mounts only claims of its own namespace)",
        ]
        manifest = tmp_path / "refused.yaml"
        manifest.write_text(json.dumps(body))
        validated = served.ftjob("validate", str(manifest))
        assert validated.returncode == 1
        assert validated.stdout.splitlines() == [f"{manifest}: {line}" for line in expected], validated.stdout
        served.create(body)
        status = served.wait("refused", "Failed", 60)
        assert status["message"].split("; ") == expected
        validated_condition = next(c for c in status["conditions"] if c["type"] == "Validated")
        assert (validated_condition["status"], validated_condition["reason"]) == ("False", "Refused")
        assert (
            client.AppsV1Api(kube)
            .list_namespaced_deployment(served.namespace, label_selector="finetune.dev/server=refused")
            .items
            == []
        )
    finally:
        core.delete_namespace(other, propagation_policy="Background")


# --- deletion ------------------------------------------------------------------------------------


def test_deleting_the_server_removes_what_it_made_and_keeps_the_jobs_and_claims(served: Served) -> None:
    apps, core = client.AppsV1Api(served.api), client.CoreV1Api(served.api)
    networking = client.NetworkingV1Api(served.api)
    selector = "finetune.dev/server=pair"
    assert networking.list_namespaced_network_policy(served.namespace, label_selector=selector).items
    served.custom.delete_namespaced_custom_object(GROUP, VERSION, served.namespace, SERVER_PLURAL, "pair")

    def gone() -> bool:
        return not any(
            found.items
            for found in (
                apps.list_namespaced_deployment(served.namespace, label_selector=selector),
                core.list_namespaced_service(served.namespace, label_selector=selector),
                networking.list_namespaced_network_policy(served.namespace, label_selector=selector),
                core.list_namespaced_pod(served.namespace, label_selector=selector),
            )
        )

    wait_for(gone, 120, "the server's Deployment, Service, NetworkPolicy and pods to go")
    for name in ANSWERS:
        assert served.jobs.status(name)["phase"] == "Succeeded"
    claims = {c.metadata.name for c in core.list_namespaced_persistent_volume_claim(served.namespace).items}
    assert {"models", "datasets", "outputs"} <= claims
