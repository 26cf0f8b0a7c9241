"""One pod's life on the agent's node: set up, run its containers, report, stop on deletion."""

import json
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ...llama_cpp import built_tools, llama_cpp_env
from ..layout import Layout
from .kube import Kube
from .pod_env import ConfigPending, container_env
from .pod_plan import (
    START_ERROR_EXIT,
    SYSTEM_PATH,
    ContainerPlan,
    StartError,
    argv_for,
    launch_script,
    mounts_for,
    token_mount,
    with_hosts_file,
)
from .pod_status import (
    HOST_IP,
    ContainerState,
    Running,
    Terminated,
    Waiting,
    now,
    pod_status,
    termination_message,
    termination_reason,
)
from .probes import Prober, prestop_sleep, readiness_probe
from .volumes import LocalVolume, UnsupportedVolume, VolumeBuilder

log = logging.getLogger("node-agent")

POLL_SECONDS = 0.2
CONFIG_RETRY_SECONDS = 2.0
# The kubelet backs off to 5 minutes; tests need a crashing operator back sooner.
MAX_BACKOFF_SECONDS = 30
# Mount points of the staged sources (see ContainerPlan.staging); empty folders on the host.
STAGING_ROOT = Path("/run/finetune-node-agent")
# Not a kubelet's: a test's faults reach the trainer in the pods of its namespace through this
# ConfigMap: keys starting with TEST_ENV_PREFIX (the switches), TEST_ENV_FAULTS (the module
# finetune_trainer/faults.py installs, and the path it is found on: tests/support/faults.py), and
# where llama.cpp's tools are (the trainer image has them at /opt/llama.cpp, a pod on this node
# finds them where the tests unpacked them).
TEST_ENV_CONFIGMAP = "node-agent-test-env"
TEST_ENV_PREFIX = "FINETUNE_TEST_"
TEST_ENV_FAULTS = ("FINETUNE_FAULTS", "PYTHONPATH")
TEST_ENV_TOOLS = ("FINETUNE_LLAMA_CPP", "FINETUNE_LLAMA_QUANTIZE")


@dataclass(frozen=True)
class NodeContext:
    layout: Layout
    kube: Kube
    node: str
    api_port: int
    allocatable: Mapping[str, str]


def _tools_path() -> str:
    """llama.cpp's tools built from the pinned sdist (hack/llama_cpp.py), where they are built:
    a serving pod's command `llama-server` (its image's entrypoint) finds them on PATH, as a
    trainer's `python` finds the checkout's .venv. Never built here: the tests build them first."""
    folder = built_tools()
    return f"{folder}:" if folder is not None else ""


def pod_dir_name(pod: Mapping[str, Any]) -> str:
    meta = pod["metadata"]
    return f"{meta['namespace']}_{meta['name']}_{meta['uid']}"


def process_start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat: with the pid, it names one process for its whole life."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


class PodRun(threading.Thread):
    def __init__(
        self, ctx: NodeContext, pod: Mapping[str, Any], address: str = HOST_IP, hosts: Path | None = None
    ) -> None:
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.ctx = ctx
        self.pod = pod
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.uid: str = meta["uid"]
        self.dir = ctx.layout.pods / pod_dir_name(pod)
        self.stop_requested = threading.Event()
        self.grace = float(pod["spec"].get("terminationGracePeriodSeconds", 30))
        self.start_time = now()
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.killed_by_us: set[str] = set()
        self.restarts: dict[str, tuple[int, Terminated]] = {}
        # The pod's own address (status.podIP) and, for a pod with a subdomain, the hosts file
        # the agent keeps for it (network.py): mounted as its /etc/hosts.
        self.address = address
        self.hosts = hosts
        self.node: str = pod["spec"].get("nodeName") or ctx.node
        # The readiness probes' verdicts, by container (probes.py); empty without probes.
        self.prober: Prober | None = None
        self.ended = threading.Event()  # the pod's thread is done: its prober stops

    def request_stop(self, grace: float | None) -> None:
        if grace is not None:
            self.grace = min(self.grace, grace)
        self.stop_requested.set()

    # -- reporting ---------------------------------------------------------------------

    def _report(
        self,
        phase: str,
        init_states: list[ContainerState],
        states: list[ContainerState],
        message: str = "",
        reason: str = "",
    ) -> None:
        status = pod_status(
            self.pod,
            phase,
            init_states,
            states,
            start_time=self.start_time,
            message=message,
            reason=reason,
            restarts=self.restarts,
            pod_ip=self.address,
            probed=dict(self.prober.ready) if self.prober is not None else None,
        )
        self.ctx.kube.patch_pod_status(self.namespace, self.name, status)

    def _fail_to_start(self, message: str) -> None:
        stamp = now()
        failed = Terminated(START_ERROR_EXIT, "StartError", message, stamp, stamp)
        spec = self.pod["spec"]
        self._report(
            "Failed", [failed] * len(spec.get("initContainers") or []), [failed] * len(spec["containers"]), message
        )
        self.ctx.kube.event(self.pod, "Warning", "Failed", message, self.node)

    # -- setup -----------------------------------------------------------------------

    def _base_env(self, container: Mapping[str, Any], volumes: Mapping[str, LocalVolume]) -> dict[str, str]:
        home = self.dir / "home"
        home.mkdir(parents=True, exist_ok=True)
        home.chmod(0o777)
        port = str(self.ctx.api_port)
        env = {
            "PATH": f"{self.ctx.layout.venv_bin}:{_tools_path()}{SYSTEM_PATH}",
            "HOSTNAME": self.pod["spec"].get("hostname") or self.name,
            "HOME": str(home),
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": port,
            "KUBERNETES_SERVICE_PORT_HTTPS": port,
            "KUBERNETES_PORT": f"tcp://127.0.0.1:{port}",
        }
        # The trainer image carries llama.cpp at /opt/llama.cpp; here the cache's copy stands in.
        env.update(llama_cpp_env())
        env.update(self._test_env())
        token = token_mount(container, self.pod)
        if token is not None:
            # Next to the token, inside the volume: visible in the pod whatever else it mounts.
            self._write_kubeconfig(token[1], volumes[token[0]].path / "kubeconfig")
            env["KUBECONFIG"] = f"{token[1]}/kubeconfig"
        return env

    def _test_env(self) -> dict[str, str]:
        """The trainer's faults (`FINETUNE_FAULTS` and its `FINETUNE_TEST_*` switches) for the pods
        of Job J, from the ConfigMap `TEST_ENV_CONFIGMAP-J` of its namespace: the operator never
        puts them in a pod, and a test needs one inside the trainer of a job it runs through the
        operator (an OOM at a step)."""
        labels = (self.pod.get("metadata") or {}).get("labels") or {}
        job = labels.get("batch.kubernetes.io/job-name") or labels.get("job-name")
        if not job:
            return {}
        data = self.ctx.kube.lookup("configmap", self.namespace, f"{TEST_ENV_CONFIGMAP}-{job}") or {}
        allowed = (*TEST_ENV_FAULTS, *TEST_ENV_TOOLS)
        return {k: v for k, v in data.items() if k.startswith(TEST_ENV_PREFIX) or k in allowed}

    def _write_kubeconfig(self, mount: str, path: Path) -> None:
        """A kubeconfig that reads the pod's own mounted token and CA, as in-cluster config would."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {
                        "server": f"https://127.0.0.1:{self.ctx.api_port}",
                        "certificate-authority": f"{mount}/ca.crt",
                    },
                }
            ],
            "users": [{"name": "pod", "user": {"tokenFile": f"{mount}/token"}}],
            "contexts": [{"name": "pod", "context": {"cluster": "local", "user": "pod", "namespace": self.namespace}}],
            "current-context": "pod",
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o644)

    def _plan(self, container: Mapping[str, Any], volumes: Mapping[str, LocalVolume]) -> ContainerPlan:
        name = container["name"]
        # fieldRef status.podIP reads the address this pod is given (the kubelet's view, not yet the API's).
        pod = {**self.pod, "status": {**(self.pod.get("status") or {}), "podIP": self.address}}
        env = container_env(
            pod, container, self.ctx.kube.lookup, self._base_env(container, volumes), self.ctx.allocatable
        )
        termination_log = self.dir / f"{name}.termination-log"
        termination_log.write_text("")
        termination_log.chmod(0o666)
        mounts = mounts_for(container, volumes, termination_log, env)
        if self.hosts is not None:
            mounts = with_hosts_file(mounts, self.hosts)
        return ContainerPlan(
            name=name,
            argv=argv_for(container, env),
            env=env,
            workdir=container.get("workingDir") or "/",
            mounts=mounts,
            termination_log=termination_log,
            setup_error=self.dir / f"{name}.setup-error",
            log=self.dir / f"{name}.log",
            staging=STAGING_ROOT / self.uid / name,
        )

    def _setup(self) -> tuple[list[ContainerPlan], list[ContainerPlan]] | None:
        """Plans for init and app containers; waits (like the kubelet) while config is missing."""
        spec = self.pod["spec"]
        last_message = ""
        while not self.stop_requested.is_set():
            try:
                volumes = VolumeBuilder(
                    self.pod, self.dir, self.ctx.kube.lookup, self.ctx.kube.request_token, self.ctx.kube.claim_folder
                ).build_all()
                init = [self._plan(c, volumes) for c in spec.get("initContainers") or []]
                main = [self._plan(c, volumes) for c in spec["containers"]]
                return init, main
            except ConfigPending as err:
                if str(err) != last_message:
                    last_message = str(err)
                    waiting = Waiting("CreateContainerConfigError", last_message)
                    init_count = len(spec.get("initContainers") or [])
                    self._report("Pending", [waiting] * init_count, [waiting] * len(spec["containers"]))
                    self.ctx.kube.event(self.pod, "Warning", "Failed", f"Error: {last_message}", self.node)
                self.stop_requested.wait(CONFIG_RETRY_SECONDS)
            except (UnsupportedVolume, StartError, ValueError) as err:
                self._fail_to_start(str(err))
                return None
        return None

    # -- processes ---------------------------------------------------------------------

    def _launch(self, plan: ContainerPlan) -> subprocess.Popen[bytes]:
        script = self.dir / f"{plan.name}.sh"
        script.write_text(launch_script(plan))
        plan.setup_error.unlink(missing_ok=True)
        with plan.log.open("ab") as out:
            proc = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "/bin/sh", str(script)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={"PATH": SYSTEM_PATH},
            )
        record = {"pid": proc.pid, "starttime": process_start_time(proc.pid)}
        (self.dir / f"{plan.name}.pid.json").write_text(json.dumps(record))
        self.processes[plan.name] = proc
        self.ctx.kube.event(self.pod, "Normal", "Started", f"Started container {plan.name}", self.node)
        return proc

    def _terminate(self) -> None:
        """The preStop sleeps, then SIGTERM to each container's process, SIGKILL to its whole group
        once the grace period (which the sleeps count in, as the kubelet counts them) is over."""
        alive = {name: p for name, p in self.processes.items() if p.poll() is None}
        deadline = time.monotonic() + self.grace
        containers = {c["name"]: c for c in self.pod["spec"]["containers"]}
        pause = max((prestop_sleep(containers.get(name) or {}) for name in alive), default=0.0)
        until = min(deadline, time.monotonic() + pause)
        while time.monotonic() < until and any(p.poll() is None for p in alive.values()):
            time.sleep(POLL_SECONDS)
        for proc in alive.values():
            _signal(proc, signal.SIGTERM, group=False)
        while time.monotonic() < deadline and any(p.poll() is None for p in alive.values()):
            time.sleep(POLL_SECONDS)
        for name, proc in alive.items():
            if proc.poll() is None:
                self.killed_by_us.add(name)
            _signal(proc, signal.SIGKILL, group=True)
        for proc in alive.values():
            proc.wait()

    def _wait(self, names: list[str]) -> None:
        while any(self.processes[n].poll() is None for n in names):
            if self.stop_requested.is_set():
                self._terminate()
                return
            time.sleep(POLL_SECONDS)
        for name in names:
            # Children the command left behind die with it, as with a container's cgroup.
            _signal(self.processes[name], signal.SIGKILL, group=True)

    def _result(self, plan: ContainerPlan, container: Mapping[str, Any], started: str) -> Terminated:
        proc = self.processes[plan.name]
        code = proc.returncode
        # Tells a following `logs -f` that no more output comes.
        (self.dir / f"{plan.name}.exit").write_text(str(code))
        exit_code = 128 - code if code < 0 else code
        reason = termination_reason(exit_code)
        if code == -signal.SIGKILL and plan.name not in self.killed_by_us:
            reason = "OOMKilled"
        message = termination_message(_read(plan.termination_log, 8192), container, exit_code, _tail(plan.log))
        if exit_code == START_ERROR_EXIT and _read(plan.setup_error, 4096).strip():
            reason, message = "StartError", _read(plan.setup_error, 4096).strip()
        return Terminated(exit_code, reason, message, started, now(), proc.pid)

    # -- the pod's life --------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._run()
        except Exception as err:
            log.exception("pod %s/%s: agent error", self.namespace, self.name)
            try:
                self._fail_to_start(f"node agent error: {err}")
            except Exception:
                log.exception("pod %s/%s: could not report the failure", self.namespace, self.name)
        finally:
            self.ended.set()
            shutil.rmtree(STAGING_ROOT / self.uid, ignore_errors=True)
            if self.stop_requested.is_set():
                self.ctx.kube.delete_pod_now(self.namespace, self.name, self.uid)

    def _run(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        spec = self.pod["spec"]
        plans = self._setup()
        if plans is None:
            return
        init_plans, main_plans = plans
        init_states: list[ContainerState] = []
        pending_main: list[ContainerState] = [Waiting("PodInitializing")] * len(main_plans)
        for index, plan in enumerate(init_plans):
            started = now()
            proc = self._launch(plan)
            waiting: list[ContainerState] = [Waiting("PodInitializing")] * (len(init_plans) - index - 1)
            self._report("Pending", [*init_states, Running(started, proc.pid), *waiting], pending_main)
            self._wait([plan.name])
            result = self._result(plan, spec["initContainers"][index], started)
            init_states.append(result)
            if result.exit_code != 0 or self.stop_requested.is_set():
                self._report("Failed", [*init_states, *waiting], pending_main)
                return
        if self.stop_requested.is_set():
            return
        results = self._run_containers(main_plans, init_states)
        phase = "Succeeded" if all(r.exit_code == 0 for r in results) else "Failed"
        self._report(phase, init_states, list(results))
        for result, plan in zip(results, main_plans, strict=True):
            kind = "Normal" if result.exit_code == 0 else "Warning"
            message = f"container {plan.name} exited with {result.exit_code} ({result.reason})"
            self.ctx.kube.event(self.pod, kind, "Terminated", message, self.node)

    def _start_prober(self, containers: Mapping[str, Any], states: Mapping[str, ContainerState]) -> dict[str, bool]:
        """A thread for the containers' readiness probes, if any; their verdicts so far."""
        probes = {name: p for name, c in containers.items() if (p := readiness_probe(c, self.address)) is not None}
        if not probes:
            return {}

        def running(name: str) -> bool:
            proc = self.processes.get(name)
            return isinstance(states.get(name), Running) and proc is not None and proc.poll() is None

        self.prober = Prober(probes, running, self.ended)
        self.prober.start()
        return dict(self.prober.ready)

    def _run_containers(self, plans: list[ContainerPlan], init_states: list[ContainerState]) -> list[Terminated]:
        """Run the app containers until each is done, restarting as restartPolicy says (with back-off)."""
        containers = {c["name"]: c for c in self.pod["spec"]["containers"]}
        policy = self.pod["spec"].get("restartPolicy", "Always")
        states: dict[str, ContainerState] = {}
        relaunch_at: dict[str, float] = {p.name: 0.0 for p in plans}
        done: dict[str, Terminated] = {}

        def report() -> None:
            self._report("Running", init_states, [states[p.name] for p in plans])

        readiness = self._start_prober(containers, states)
        while len(done) < len(plans):
            if self.prober is not None and self.prober.ready != readiness:
                readiness = dict(self.prober.ready)
                report()
            if self.stop_requested.is_set():
                self._terminate()
                for plan in plans:
                    current = states.get(plan.name)
                    if plan.name not in done and isinstance(current, Running):
                        done[plan.name] = self._result(plan, containers[plan.name], current.started_at)
                    elif plan.name in self.restarts:
                        done[plan.name] = self.restarts[plan.name][1]
                    elif plan.name not in done:
                        stamp = now()
                        done[plan.name] = Terminated(
                            137, "ContainerStatusUnknown", "stopped before start", stamp, stamp
                        )
                break
            changed = False
            for plan in plans:
                name = plan.name
                if name in done:
                    continue
                if name in relaunch_at:
                    if time.monotonic() >= relaunch_at[name]:
                        del relaunch_at[name]
                        states[name] = Running(now(), self._launch(plan).pid)
                        changed = True
                    continue
                if self.processes[name].poll() is None:
                    continue
                # Children the command left behind die with it, as with a container's cgroup.
                _signal(self.processes[name], signal.SIGKILL, group=True)
                current = states[name]
                assert isinstance(current, Running)
                result = self._result(plan, containers[name], current.started_at)
                if policy == "Always" or (policy == "OnFailure" and result.exit_code != 0):
                    count = self.restarts.get(name, (0, result))[0] + 1
                    self.restarts[name] = (count, result)
                    relaunch_at[name] = time.monotonic() + min(2 ** (count - 1), MAX_BACKOFF_SECONDS)
                    states[name] = Waiting("CrashLoopBackOff", f"back-off restarting failed container {name}")
                else:
                    done[name] = result
                    states[name] = result
                changed = True
            if changed and len(done) < len(plans):
                report()
            time.sleep(POLL_SECONDS)
        return [done[p.name] for p in plans]


def _signal(proc: subprocess.Popen[bytes], sig: signal.Signals, group: bool) -> None:
    try:
        if group:
            os.killpg(proc.pid, sig)
        elif proc.poll() is None:
            os.kill(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _read(path: Path, limit: int) -> str:
    try:
        with path.open("rb") as handle:
            return handle.read(limit).decode(errors="replace")
    except OSError:
        return ""


def _tail(path: Path, size: int = 8192) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(max(path.stat().st_size - size, 0))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""
