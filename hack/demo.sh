#!/usr/bin/env bash
# `make demo`: from a fresh clone to a trained LoRA adapter on a local control plane.
# Sets up the venv, starts the control plane, installs the chart, makes a tiny model and a
# learnable dataset in the PVC folders, applies examples/tiny-job.yaml, follows it live, then
# prints where the adapter is and writes a loss-curve PNG next to it.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
STARTED=$(date +%s)

# DEMO_HELM_ARGS adds chart flags, e.g. "--set watch.mode=namespaced --set watch.namespaces={default}"
# on a shared cluster where another operator already watches every namespace.
NS=${DEMO_NAMESPACE:-default}
OPERATOR_NS=${DEMO_OPERATOR_NAMESPACE:-finetune-system}
RELEASE=finetune-operator
JOB=tiny
VOLUMES=$ROOT/.cache/cluster/volumes/$NS
export PATH="$ROOT/.venv/bin:$ROOT/.cache/cluster/bin:$PATH"
export KUBECONFIG=$ROOT/.cache/cluster/kubeconfig

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
fail() { printf 'demo: %s\n' "$*" >&2; exit 1; }

step "1/7 Python environment (make dev)"
make --no-print-directory dev

step "2/7 Local control plane: etcd, kube-apiserver, controller-manager, scheduler, KWOK GPU nodes, node agent"
make --no-print-directory cluster-up

step "3/7 helm install $RELEASE charts/finetune-operator (namespace $OPERATOR_NS)"
helm upgrade --install "$RELEASE" charts/finetune-operator \
  --namespace "$OPERATOR_NS" --create-namespace \
  --values hack/demo/values.yaml ${DEMO_HELM_ARGS:-} --wait --timeout 5m
kubectl -n "$OPERATOR_NS" rollout status "deployment/$RELEASE" --timeout=120s
kubectl get crd finetunejobs.finetune.dev >/dev/null

step "4/7 A tiny Llama and a small learnable dataset in the PVC folders"
kubectl get namespace "$NS" >/dev/null 2>&1 || kubectl create namespace "$NS"
# A previous run's job and outputs would make this one resume instead of train.
kubectl -n "$NS" delete finetunejob "$JOB" --ignore-not-found --wait=true
rm -rf "$VOLUMES/outputs/$JOB"
# Claims first: the local provisioner answers each with the folder volumes/<namespace>/<claim>/.
kubectl -n "$NS" apply -f hack/demo/pvcs.yaml
for claim in models datasets outputs; do
  kubectl -n "$NS" wait --for=jsonpath='{.status.phase}'=Bound "pvc/$claim" --timeout=60s >/dev/null
done
# The tokenizer is trained on the same generator that writes the dataset, so they agree.
ftjob make-tiny-model "$VOLUMES/models/tiny-llama" --dataset "$VOLUMES/datasets/tiny/alpaca.jsonl"

step "5/7 kubectl apply -f examples/tiny-job.yaml"
ftjob validate examples/tiny-job.yaml
kubectl -n "$NS" apply -f examples/tiny-job.yaml

step "6/7 ftjob watch $JOB"
ftjob watch "$JOB" -n "$NS" --timeout 1200 || {
  kubectl -n "$NS" describe finetunejob "$JOB" | tail -30 >&2
  fail "job $JOB did not succeed"
}

step "7/7 Results"
ADAPTER=$(kubectl -n "$NS" get finetunejob "$JOB" -o jsonpath='{.status.output.adapterPath}')
CLAIM=$(kubectl -n "$NS" get finetunejob "$JOB" -o jsonpath='{.status.output.claimName}')
# The pod sees the output claim at /mnt/output; on this machine the claim is a local folder.
LOCAL_ADAPTER=$VOLUMES/${CLAIM:-outputs}/${ADAPTER#/mnt/output/}
[ -d "$LOCAL_ADAPTER" ] || fail "adapter folder $LOCAL_ADAPTER (status.output.adapterPath=$ADAPTER) does not exist"
OUTPUT_DIR=$(dirname "$LOCAL_ADAPTER")
# The trainer's JSON progress lines are its log: `kubectl logs` where a kubelet serves them,
# else the node agent's log files.
if ! kubectl -n "$NS" logs "job/$JOB" > "$OUTPUT_DIR/trainer.log" 2>/dev/null; then
  cat "$ROOT/.cache/cluster/pods/${NS}_${JOB}-"*/trainer.log > "$OUTPUT_DIR/trainer.log" 2>/dev/null || true
fi
python -m hack.demo.loss_curve "$OUTPUT_DIR/loss-curve.png" "$OUTPUT_DIR" --title "FineTuneJob $NS/$JOB"
ls -l "$LOCAL_ADAPTER"

ELAPSED=$(( $(date +%s) - STARTED ))
cat <<DONE

Adapter:     $ADAPTER on PVC ${CLAIM:-outputs} (here: ${LOCAL_ADAPTER#$ROOT/})
Loss curve:  ${OUTPUT_DIR#$ROOT/}/loss-curve.png
Demo took ${ELAPSED}s.

Look around (the cluster keeps running):
  export KUBECONFIG=$KUBECONFIG PATH=$ROOT/.cache/cluster/bin:$ROOT/.venv/bin:\$PATH
  kubectl get ftj -n $NS
  kubectl describe ftj $JOB -n $NS
  kubectl get jobs,pods -n $NS -l finetune.dev/job=$JOB
  kubectl get events -n $NS --field-selector involvedObject.name=$JOB
  ftjob status $JOB -n $NS
  helm status $RELEASE -n $OPERATOR_NS
When done:
  make cluster-down
DONE
