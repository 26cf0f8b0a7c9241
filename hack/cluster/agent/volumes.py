"""A pod's volumes as local folders: what each volume name is bound to on this machine."""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .pod_env import ConfigPending, Lookup, field_value

# (namespace, service account, audience or None, expiration seconds, pod) -> token
TokenRequester = Callable[[str, str, str | None, int, Mapping[str, Any]], str]
# (namespace, claim) -> folder of the bound volume, or None while the claim is unbound
ClaimResolver = Callable[[str, str], Path | None]


class UnsupportedVolume(Exception):
    """A volume type the agent cannot provide; the pod fails with this message."""


@dataclass(frozen=True)
class LocalVolume:
    path: Path
    read_only: bool = False


def _write(folder: Path, relative: str, content: bytes, mode: int) -> None:
    target = folder / relative
    if not target.resolve().is_relative_to(folder.resolve()):
        raise UnsupportedVolume(f"path {relative!r} escapes the volume")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(content)
    target.chmod(mode)


def _key_files(
    folder: Path, data: Mapping[str, str], items: list[dict[str, Any]] | None, default_mode: int, what: str
) -> None:
    if items:
        for item in items:
            if item["key"] not in data:
                raise ConfigPending(f"{what}: key {item['key']} not found")
            _write(folder, item["path"], data[item["key"]].encode(), item.get("mode", default_mode))
    else:
        for key, value in data.items():
            _write(folder, key, value.encode(), default_mode)


class VolumeBuilder:
    """Creates each volume of one pod under `pod_dir/volumes/` (I/O through the injected callables)."""

    def __init__(
        self,
        pod: Mapping[str, Any],
        pod_dir: Path,
        lookup: Lookup,
        request_token: TokenRequester,
        claim_folder: ClaimResolver,
    ) -> None:
        self.pod = pod
        self.namespace: str = pod["metadata"]["namespace"]
        self.root = pod_dir / "volumes"
        self.lookup = lookup
        self.request_token = request_token
        self.claim_folder = claim_folder

    def build_all(self) -> dict[str, LocalVolume]:
        return {volume["name"]: self.build(volume) for volume in self.pod["spec"].get("volumes") or []}

    def build(self, volume: Mapping[str, Any]) -> LocalVolume:
        name = volume["name"]
        folder = self.root / name
        if "persistentVolumeClaim" in volume:
            source = volume["persistentVolumeClaim"]
            path = self.claim_folder(self.namespace, source["claimName"])
            if path is None:
                raise ConfigPending(f'persistentvolumeclaim "{source["claimName"]}" is not bound')
            return LocalVolume(path, bool(source.get("readOnly")))
        if "emptyDir" in volume:
            # medium: Memory (e.g. /dev/shm) is a folder too: the point is a private writable place.
            folder.mkdir(parents=True, exist_ok=True)
            folder.chmod(0o777)
            return LocalVolume(folder)
        if "hostPath" in volume:
            path = Path(volume["hostPath"]["path"])
            if volume["hostPath"].get("type") == "DirectoryOrCreate":
                path.mkdir(parents=True, exist_ok=True)
            return LocalVolume(path)
        if "configMap" in volume or "secret" in volume or "projected" in volume or "downwardAPI" in volume:
            folder.mkdir(parents=True, exist_ok=True)
            self._fill(folder, volume)
            return LocalVolume(folder, read_only=True)
        kinds = sorted(set(volume) - {"name"})
        raise UnsupportedVolume(f"volume {name}: {', '.join(kinds)} is not supported by the node agent")

    def _fill(self, folder: Path, volume: Mapping[str, Any]) -> None:
        if "configMap" in volume:
            self._config(folder, "configmap", volume["configMap"], volume["configMap"].get("defaultMode", 0o644))
        elif "secret" in volume:
            source = dict(volume["secret"], name=volume["secret"]["secretName"])
            self._config(folder, "secret", source, source.get("defaultMode", 0o644))
        elif "downwardAPI" in volume:
            source = volume["downwardAPI"]
            self._downward(folder, source.get("items") or [], source.get("defaultMode", 0o644))
        else:
            source = volume["projected"]
            mode = source.get("defaultMode", 0o644)
            for projection in source.get("sources") or []:
                if "serviceAccountToken" in projection:
                    self._token(folder, projection["serviceAccountToken"], mode)
                elif "configMap" in projection:
                    self._config(folder, "configmap", projection["configMap"], mode)
                elif "secret" in projection:
                    self._config(folder, "secret", projection["secret"], mode)
                elif "downwardAPI" in projection:
                    self._downward(folder, projection["downwardAPI"].get("items") or [], mode)
                else:
                    raise UnsupportedVolume(f"projected source {sorted(projection)} is not supported by the node agent")

    def _config(self, folder: Path, kind: str, source: Mapping[str, Any], mode: int) -> None:
        data = self.lookup(kind, self.namespace, source["name"])
        if data is None:
            if source.get("optional"):
                return
            raise ConfigPending(f'{kind} "{source["name"]}" not found')
        _key_files(folder, data, source.get("items"), mode, f"{kind} {source['name']}")

    def _downward(self, folder: Path, items: list[dict[str, Any]], mode: int) -> None:
        for item in items:
            if "fieldRef" not in item:
                raise UnsupportedVolume("downwardAPI: only fieldRef items are supported by the node agent")
            value = field_value(self.pod, item["fieldRef"]["fieldPath"])
            _write(folder, item["path"], value.encode(), item.get("mode", mode))

    def _token(self, folder: Path, source: Mapping[str, Any], mode: int) -> None:
        account = self.pod["spec"].get("serviceAccountName") or "default"
        token = self.request_token(
            self.namespace, account, source.get("audience"), int(source.get("expirationSeconds", 3607)), self.pod
        )
        _write(folder, source["path"], token.encode(), mode)
