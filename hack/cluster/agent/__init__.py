"""The node agent: test support that stands in for the kubelet on nodes `local-0`, `local-1` (not product code).

There is no container runtime here, so for each pod the scheduler binds to one of them the agent
runs every container's command/args as a local root process inside a private mount namespace
(`unshare -m`), with the pod's volumes bind-mounted at the real in-pod paths:

  PVC            -> the bound PV's folder, `.cache/cluster/volumes/<namespace>/<claim>/`
  ConfigMap/Secret/projected/downwardAPI -> files written under the pod's folder
  serviceAccountToken (incl. the automatic kube-api-access volume) -> a TokenRequest token
                    bound to the pod, so /var/run/secrets/kubernetes.io/serviceaccount/ is real
  emptyDir (medium Memory too, e.g. /dev/shm) -> a folder under the pod's folder
  terminationMessagePath (/dev/termination-log) -> a per-container file; its content becomes
                    the container's `terminated.message`

The process gets exactly the pod's env (env, envFrom, valueFrom secretKeyRef/configMapKeyRef/
fieldRef/resourceFieldRef, `$(VAR)` expansion), plus what a kubelet and image would add:
KUBERNETES_SERVICE_HOST/PORT pointing at the local API server, HOSTNAME, HOME (a per-pod
folder), PATH with the checkout's `.venv/bin` first (so `python`, `kopf`, `ftjob` are the
project's), KUBECONFIG (a kubeconfig that reads the pod's mounted token) when the pod
mounts a service-account token, and where llama.cpp's converters and llama-quantize are in the
cache (FINETUNE_LLAMA_CPP, FINETUNE_LLAMA_QUANTIZE: the trainer image has them at /opt/llama.cpp),
so a job's GGUF formats are written here as in the image.

Decisions a kubelet would make differently, on purpose:
- Processes run as root even when the pod asks for `runAsUser`: the interpreter lives under a
  home folder other users cannot enter on dev machines, and PodSecurity admission already
  checks the field at the API. Volume folders are world-writable, so nothing depends on it.
- The image is ignored; a container without `command` fails with StartError (the agent cannot
  know an image's entrypoint). The images' commands resolve on PATH: the trainer's `python` to
  the checkout's `.venv/bin`, the serving image's `llama-server` to llama.cpp's tools built from
  the pinned sdist (`python -m hack.llama_cpp tools`), where they are built.
- Mount points missing on the host (e.g. /mnt/model, /etc/finetune) are created there as empty
  folders or files; the mounts themselves stay private to the pod's namespace.
- Each pod has an address of its own in 198.18.0.0/16, routed to this host (status.podIP), and, with a `subdomain`, an
  /etc/hosts that names its peers in place of cluster DNS (see network.py); the pods still share
  the host's network namespace.
- Readiness probes of kind httpGet are run against the pod's address (probes.py): such a
  container is Ready once one answers 200-399 (a ModelServer's llama-server on /health); a
  container without one is Ready while it runs. Liveness and startup probes are not run. A
  `preStop: sleep` is slept before SIGTERM, within the grace period.
- A ConfigMap `node-agent-test-env-<Job name>` adds its `FINETUNE_FAULTS`, `PYTHONPATH` and
  `FINETUNE_TEST_*` keys to the environment of every container of that Job's pods: the tests'
  faults (tests/support/trainer_faults.py, installed by finetune_trainer/faults.py) for a job run
  through the operator, which never sets them.
- Logs go to `.cache/cluster/pods/<namespace>_<pod>_<uid>/<container>.log`; the agent serves
  them as the kubelet's containerLogs endpoint, so `kubectl logs` works.
- restartPolicy Always/OnFailure restart the container with back-off 1 s, 2 s, ... 30 s
  (the kubelet goes to 5 min), reported as restartCount, lastState and CrashLoopBackOff.

On deletion the agent sends SIGTERM, then SIGKILL to the process group after the grace period, reports the
final state and removes the pod, as the kubelet does.
"""
