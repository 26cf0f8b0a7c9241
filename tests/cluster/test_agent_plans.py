"""The node agent's pure parts: env resolution, mounts and the launch script (no cluster needed)."""

import ipaddress
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack.cluster.agent.network import Addresses, PodName, hosts_file, pod_name
from hack.cluster.agent.pod_env import ConfigPending, container_env, expand
from hack.cluster.agent.pod_plan import (
    ContainerPlan,
    Mount,
    StartError,
    argv_for,
    launch_script,
    mounts_for,
    with_hosts_file,
)
from hack.cluster.agent.volumes import LocalVolume
from hack.cluster.control_plane import KWOK_STAGES
from hack.cluster.layout import LOCAL_NODES
from hack.cluster.nodes import LOCAL_EXTRA_TAINT, local_nodes

POD: dict[str, Any] = {
    "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": {"app": "x"}},
    "spec": {"nodeName": "local-0", "serviceAccountName": "sa"},
    "status": {},
}


def lookup(kind: str, namespace: str, name: str) -> dict[str, str] | None:
    data = {("configmap", "cm"): {"a": "1", "b": "2"}, ("secret", "s"): {"token": "t0p"}}
    return data.get((kind, name))


def test_expand_follows_kubernetes_rules() -> None:
    env = {"A": "x"}
    assert expand("$(A)-$(B)-$$(A)-$$", env) == "x-$(B)-$(A)-$"


def test_env_resolves_refs_in_order() -> None:
    container = {
        "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}],
        "env": [
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "token"}}},
            {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "BOTH", "value": "$(NAME)/$(CM_a)"},
            {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
            {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "missing", "key": "k", "optional": True}}},
        ],
        "resources": {"limits": {"cpu": "1500m"}},
    }
    env = container_env(POD, container, lookup, {"PATH": "/bin"})
    assert env == {
        "PATH": "/bin",
        "CM_a": "1",
        "CM_b": "2",
        "TOKEN": "t0p",
        "NAME": "p",
        "APP": "x",
        "BOTH": "p/1",
        "CPU": "2",
    }


def test_missing_required_key_waits_for_config() -> None:
    container = {"env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "nope"}}}]}
    with pytest.raises(ConfigPending, match="nope"):
        container_env(POD, container, lookup, {})


def test_container_without_command_cannot_start() -> None:
    with pytest.raises(StartError, match="command"):
        argv_for({"name": "main", "args": ["x"]}, {})


def test_mounts_put_parents_first_and_honour_read_only(tmp_path: Path) -> None:
    volumes = {"out": LocalVolume(tmp_path / "out"), "model": LocalVolume(tmp_path / "model", read_only=True)}
    container = {
        "name": "main",
        "volumeMounts": [
            {"name": "out", "mountPath": "/mnt/output/run", "subPath": "run"},
            {"name": "model", "mountPath": "/mnt/model"},
        ],
    }
    mounts = mounts_for(container, volumes, tmp_path / "term", {})
    assert [m.target for m in mounts] == ["/mnt/model", "/dev/termination-log", "/mnt/output/run"]
    assert mounts[0].read_only and not mounts[2].read_only
    assert (tmp_path / "out" / "run").is_dir()


def test_launch_script_is_valid_shell_and_quotes_everything(tmp_path: Path) -> None:
    plan = ContainerPlan(
        name="main",
        argv=("echo", "it's $HOME", "a b"),
        env={"V": "x'y z\nnext"},
        workdir="/",
        mounts=(Mount(tmp_path / "src", "/mnt/a b", read_only=True, is_file=False),),
        termination_log=tmp_path / "t",
        setup_error=tmp_path / "e",
        log=tmp_path / "l",
        staging=tmp_path / "stage",
    )
    script = launch_script(plan)
    assert subprocess.run(["sh", "-n"], input=script, text=True, check=False).returncode == 0
    assert "mount -o remount,bind,ro '/mnt/a b'" in script
    assert "'it'\"'\"'s $HOME'" in script


def test_kwok_stages_parse_and_cover_the_pod_life() -> None:
    stages = [doc for doc in yaml.safe_load_all(KWOK_STAGES.read_text()) if doc]
    names = {s["metadata"]["name"] for s in stages}
    assert {"node-initialize", "pod-ready", "pod-complete", "pod-fail", "pod-delete"} <= names


# --- several nodes: an address per pod, names behind a subdomain -----------------------------


def test_each_running_pod_gets_an_address_of_its_own_on_its_node() -> None:
    addresses = Addresses()
    alive = {"a", "b", "c"}
    first = addresses.allocate("a", "local-0", alive.__contains__)
    second = addresses.allocate("b", "local-0", alive.__contains__)
    other = addresses.allocate("c", "local-1", alive.__contains__)
    assert (first, second, other) == ("198.18.0.2", "198.18.0.3", "198.18.1.2")
    assert addresses.allocate("a", "local-0", alive.__contains__) == first
    assert all(ipaddress.ip_address(a) in ipaddress.ip_network("198.18.0.0/16") for a in (first, second, other))
    # The API server's pod proxy refuses any pod address that is not global unicast.
    assert not any(
        ipaddress.ip_address(a).is_loopback or ipaddress.ip_address(a).is_link_local for a in (first, second)
    )
    alive.discard("a")  # ended: its address is free again
    assert addresses.allocate("d", "local-0", {"b", "c", "d"}.__contains__) == first


def test_a_pod_with_a_subdomain_resolves_every_peer_of_its_namespace_and_subdomain() -> None:
    def member(name: str, index: int, address: str, namespace: str = "ns", subdomain: str = "job") -> PodName:
        pod = {
            "metadata": {"name": f"{name}-{index}-xyz", "namespace": namespace},
            "spec": {"hostname": f"{name}-{index}", "subdomain": subdomain},
        }
        found = pod_name(pod, address)
        assert found is not None
        return found

    me = member("job", 1, "127.1.1.2")
    peers = [
        member("job", 0, "127.1.0.2"),
        me,
        member("job", 0, "127.1.0.9", namespace="other"),
        member("x", 0, "127.1.0.7", subdomain="x"),
    ]
    text = hosts_file("127.0.0.1\tlocalhost\n", me, peers)
    assert text.startswith("127.0.0.1\tlocalhost\n")
    entries = [line.split("\t") for line in text.splitlines() if line.startswith("127.1.")]
    assert entries == [
        ["127.1.0.2", "job-0.job.ns.svc.cluster.local", "job-0.job"],
        ["127.1.1.2", "job-1.job.ns.svc.cluster.local", "job-1.job", "job-1"],
    ]
    assert pod_name({"metadata": {"name": "p", "namespace": "ns"}, "spec": {}}, "127.1.0.2") is None


def test_the_hosts_file_is_mounted_read_only_over_etc_hosts(tmp_path: Path) -> None:
    mounts = with_hosts_file((Mount(tmp_path / "t", "/dev/termination-log", False, True),), tmp_path / "hosts")
    assert Mount(tmp_path / "hosts", "/etc/hosts", True, True) in mounts


def test_nodes_other_than_local_0_take_only_pods_that_ask_for_them() -> None:
    nodes = {n["metadata"]["name"]: n for n in local_nodes()}
    assert list(nodes) == list(LOCAL_NODES) and len(nodes) >= 2
    assert not nodes["local-0"]["spec"].get("taints")
    for name in LOCAL_NODES[1:]:
        assert nodes[name]["spec"]["taints"] == [LOCAL_EXTRA_TAINT]
