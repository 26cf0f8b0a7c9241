"""What the agent will do for one container, decided without I/O: mounts, argv, env, the launch script."""

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from ..layout import REPO_ROOT
from .pod_env import expand
from .volumes import LocalVolume

DEFAULT_TERMINATION_PATH = "/dev/termination-log"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The kubelet's own exit code for a container that could not start.
START_ERROR_EXIT = 128


class StartError(Exception):
    """The container cannot be started as specified; the pod fails with this message."""


@dataclass(frozen=True)
class Mount:
    source: Path
    target: str
    read_only: bool
    is_file: bool


@dataclass(frozen=True)
class ContainerPlan:
    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    workdir: str
    mounts: tuple[Mount, ...]
    termination_log: Path
    setup_error: Path
    log: Path
    # Where every source is bind-mounted first: a later mount (e.g. an emptyDir at /tmp) may hide
    # the source folders of mounts that follow it, and the staging area is outside any pod path.
    staging: Path
    extra: Mapping[str, Any] = field(default_factory=dict)


def argv_for(container: Mapping[str, Any], env: Mapping[str, str]) -> tuple[str, ...]:
    command = list(container.get("command") or [])
    if not command:
        raise StartError(
            f"container {container['name']}: no command; the node agent cannot read the image's entrypoint, "
            "so pods on local-0 must set `command`"
        )
    return tuple(expand(part, env) for part in [*command, *(container.get("args") or [])])


def mounts_for(
    container: Mapping[str, Any], volumes: Mapping[str, LocalVolume], termination_log: Path, env: Mapping[str, str]
) -> tuple[Mount, ...]:
    mounts: list[Mount] = []
    for item in container.get("volumeMounts") or []:
        volume = volumes.get(item["name"])
        if volume is None:
            raise StartError(f"container {container['name']}: volumeMount {item['name']} names no volume")
        source = volume.path
        sub_path = item.get("subPath") or expand(item.get("subPathExpr", ""), env)
        if sub_path:
            if PurePosixPath(sub_path).is_absolute() or ".." in PurePosixPath(sub_path).parts:
                raise StartError(f"volumeMount {item['name']}: subPath {sub_path!r} must be relative")
            source = source / sub_path
            if not source.exists():
                # The kubelet creates a missing subPath as a folder.
                source.mkdir(parents=True, exist_ok=True)
        read_only = bool(item.get("readOnly")) or volume.read_only
        mounts.append(Mount(source, item["mountPath"], read_only, source.is_file()))
    target = container.get("terminationMessagePath") or DEFAULT_TERMINATION_PATH
    mounts.append(Mount(termination_log, target, False, True))
    # Parents before children, so a mount inside another mount lands inside it.
    return tuple(sorted(mounts, key=lambda mount: len(PurePosixPath(mount.target).parts)))


HOSTS_PATH = "/etc/hosts"


def with_hosts_file(mounts: tuple[Mount, ...], hosts: Path) -> tuple[Mount, ...]:
    """The pod's own /etc/hosts (the agent's stand-in for cluster DNS, see network.py), read-only."""
    extra = Mount(hosts, HOSTS_PATH, True, True)
    return tuple(sorted([*mounts, extra], key=lambda mount: len(PurePosixPath(mount.target).parts)))


def token_mount(container: Mapping[str, Any], pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(volume name, in-pod folder) of the service-account token this container mounts, if any."""
    token_volumes = {
        volume["name"]
        for volume in pod["spec"].get("volumes") or []
        if any("serviceAccountToken" in source for source in (volume.get("projected") or {}).get("sources") or [])
    }
    for item in container.get("volumeMounts") or []:
        if item["name"] in token_volumes and not item.get("subPath"):
            return str(item["name"]), str(item["mountPath"])
    return None


def launch_script(plan: ContainerPlan) -> str:
    """The shell script run under `unshare -m`: mount everything, then exec the command with only the pod's env."""
    q = shlex.quote
    lines = [
        "#!/bin/sh",
        "# Written by the node agent (test support); runs in the container's private mount namespace.",
        # Opened before any mount can hide the pod's folder.
        f"exec 9>>{q(str(plan.setup_error))}",
        f"fail() {{ printf '%s\\n' \"$1\" >&9; exit {START_ERROR_EXIT}; }}",
    ]
    staged = []
    for index, mount in enumerate(plan.mounts):
        stage = q(str(plan.staging / str(index)))
        create = f": > {stage}" if mount.is_file else f"mkdir -p {stage}"
        lines.append(f"mkdir -p {q(str(plan.staging))} && {create} || fail {q('staging ' + mount.target)}")
        lines.append(f"mount --bind {q(str(mount.source))} {stage} || fail {q('source of ' + mount.target)}")
        staged.append(stage)
    for mount, stage in zip(plan.mounts, staged, strict=True):
        target = q(mount.target)
        if mount.is_file:
            parent = q(str(PurePosixPath(mount.target).parent))
            create = f"{{ mkdir -p {parent} && : > {target}; }}"
            lines.append(f"[ -e {target} ] || {create} || fail {q('mount point ' + mount.target)}")
        else:
            lines.append(f"mkdir -p {target} || fail {q('mount point ' + mount.target)}")
        lines.append(f"mount --bind {stage} {target} || fail {q('bind mount ' + mount.target)}")
        if mount.read_only:
            lines.append(f"mount -o remount,bind,ro {target} || fail {q('read-only ' + mount.target)}")
    # A pod mount over a parent of the checkout (an emptyDir at /tmp while the repo lives under
    # /tmp, as in a CI clone) would hide the project's .venv that `python` resolves to: stage the
    # checkout before the pod's mounts and put it back on top of them afterwards.
    repo = PurePosixPath(str(REPO_ROOT))
    if any(repo.is_relative_to(PurePosixPath(mount.target)) for mount in plan.mounts):
        stage = q(str(plan.staging / "repo"))
        lines.insert(4, f"mkdir -p {stage} && mount --bind {q(str(repo))} {stage} || fail 'staging the checkout'")
        lines.append(f"mkdir -p {q(str(repo))} && mount --bind {stage} {q(str(repo))} || fail 'restoring the checkout'")
    lines.append(f"cd {q(plan.workdir)} || fail {q('workingDir ' + plan.workdir)}")
    env = " ".join(q(f"{key}={value}") for key, value in plan.env.items())
    lines.append("exec 9>&-")
    lines.append(f"exec env -i {env} {' '.join(q(part) for part in plan.argv)}")
    return "\n".join(lines) + "\n"
