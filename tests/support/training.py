"""What a trained job left behind, read from the node agent's folders: summaries, adapters, the
trainer's events; and waiting for a job to finish."""

import json
from pathlib import Path

from kubernetes import client

from tests.support.faults import faults_env
from tests.support.harness import Jobs, wait_for

CHECKPOINTS = {"everySteps": 8, "keep": 2}


RUN_TIMEOUT = 420


def trainer_hooks(core: client.CoreV1Api, namespace: str, job: str, **env: str) -> None:
    """The environment the node agent adds to the pods of Job `job` (hack/cluster/agent/runner.py):
    the trainer's faults (`FINETUNE_TEST_*` switches, with what installs them: tests/support/faults.py)
    and where llama.cpp's tools are."""
    switches = {k: v for k, v in env.items() if k.startswith("FINETUNE_TEST_")}
    data = {**env, **(faults_env(**switches) if switches else {})}
    meta = client.V1ObjectMeta(name=f"node-agent-test-env-{job}")
    core.create_namespaced_config_map(namespace, client.V1ConfigMap(metadata=meta, data=data))


def trainer_hooks_off(core: client.CoreV1Api, namespace: str, job: str) -> None:
    """No more faults for the pods of Job `job` that start from now on (the node agent reads them
    as it starts a pod): a delay that only had to hold a run until a test stopped it costs
    nothing in the attempt that finishes it."""
    core.delete_namespaced_config_map(f"node-agent-test-env-{job}", namespace)


def host_path(folders: dict[str, Path], pod_path: str) -> Path:
    """Where a path inside the pod's /mnt/output lies in the outputs PVC folder."""
    relative = Path(pod_path).relative_to("/mnt/output")
    return folders["outputs"] / relative


def watch_until_done(jobs: Jobs, name: str, timeout: float = RUN_TIMEOUT) -> tuple[list[str], list[int], dict]:
    """Phases and progress steps seen, in order, until the job is Succeeded or Failed."""
    phases: list[str] = []
    steps: list[int] = []

    def done() -> dict | None:
        status = jobs.status(name)
        phase = status.get("phase")
        if phase and (not phases or phases[-1] != phase):
            phases.append(phase)
        step = (status.get("progress") or {}).get("step")
        if step is not None and (not steps or steps[-1] != step):
            steps.append(step)
        return status if phase in ("Succeeded", "Failed") else None

    final = wait_for(done, timeout, f"{name} to finish", interval=0.5)
    return phases, steps, final


def summary(folders: dict[str, Path], name: str) -> dict:
    return json.loads((folders["outputs"] / name / "summary.json").read_text())


def running_pod(jobs: Jobs, name: str) -> dict | None:
    return next((p for p in jobs.pods(name) if p["status"].get("phase") == "Running"), None)


# Equal adapters from the same math (see tests/trainer/test_parallel.py for the tolerance).
ADAPTER_TOLERANCE = 1e-5


def adapter_tensors(folders: dict[str, Path], status: dict) -> dict:
    from safetensors.torch import load_file

    return load_file(str(host_path(folders, status["output"]["adapterPath"]) / "adapter_model.safetensors"))


def max_difference(a: dict, b: dict) -> float:
    """The largest absolute difference between two adapters' tensors of the same names."""
    assert sorted(a) == sorted(b), "the adapters hold different tensors"
    return max(float((a[k] - b[k]).abs().max()) for k in a)


# How far training must have moved an adapter before two equal ones mean anything: LoRA starts
# every lora_B at zero (PEFT's default init), so two adapters that never trained are equal too.
# A hundred tolerances: a step of the tests' recipes (learning rate 1e-2) moves lora_B by ~1e-2.
MOVED_AT_LEAST = 100 * ADAPTER_TOLERANCE


def movement(adapter: dict) -> float:
    """How far the adapter is from its initial value: the largest |lora_B| (zero at init)."""
    lora_b = [t for name, t in adapter.items() if ".lora_B." in name]
    assert lora_b, f"no lora_B tensor among {sorted(adapter)[:4]}"
    return max(float(t.abs().max()) for t in lora_b)


def assert_same_trained_adapter(a: dict, b: dict) -> None:
    """`a` equals `b` within ADAPTER_TOLERANCE, and both moved from their initial value."""
    for which, adapter in (("first", a), ("second", b)):
        assert movement(adapter) > MOVED_AT_LEAST, f"the {which} adapter never trained: {movement(adapter)}"
    difference = max_difference(a, b)
    assert difference <= ADAPTER_TOLERANCE, difference


def trainer_event(cluster, namespace: str, pod_name: str, kind: str) -> dict | None:
    """The trainer's last `kind` event in a (possibly deleted) pod's log on the node agent."""
    found = None
    for log in Path(cluster.layout.pods).glob(f"{namespace}_{pod_name}_*/*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith(f'{{"event":"{kind}"'):
                found = json.loads(line)
    return found
