#!/usr/bin/env bash
# `make demo`: from a fresh clone to a trained LoRA adapter on a local control plane.
# Sets up the venv, starts the control plane, installs the chart, makes a tiny model and the data
# every example of the demo cluster reads (an Alpaca set for tiny-job.yaml, preference pairs for
# dpo-tiny.yaml and orpo-tiny.yaml) in the PVC folders, applies examples/tiny-job.yaml, follows it
# live, then prints the adapter, the loss curve the trainer drew beside it and its sample answer.
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

step "4/7 A tiny Llama, its datasets and llama.cpp's converters"
kubectl get namespace "$NS" >/dev/null 2>&1 || kubectl create namespace "$NS"
# A previous run's job and outputs would make this one resume instead of train.
kubectl -n "$NS" delete finetunejob "$JOB" --ignore-not-found --wait=true
rm -rf "$VOLUMES/outputs/$JOB"
# Claims first: the local provisioner answers each with the folder volumes/<namespace>/<claim>/.
kubectl -n "$NS" apply -f hack/demo/pvcs.yaml
for claim in models datasets outputs; do
  kubectl -n "$NS" wait --for=jsonpath='{.status.phase}'=Bound "pvc/$claim" --timeout=60s >/dev/null
done
# The tokenizer is trained on the same generator that writes the datasets, so they agree. The
# preference pairs are what examples/dpo-tiny.yaml and orpo-tiny.yaml train on.
ftjob make-tiny-model "$VOLUMES/models/tiny-llama" --dataset "$VOLUMES/datasets/tiny/alpaca.jsonl" \
  --preference "$VOLUMES/datasets/tiny/preference.jsonl"
# examples/grpo-job.yaml's prompts: small sums with the answer its rewards check.
cp examples/data/arithmetic.jsonl "$VOLUMES/datasets/tiny/arithmetic.jsonl"
# examples/tiny-gguf.yaml's model: a tokenizer llama.cpp's converter takes, for its GGUF files.
ftjob make-tiny-model "$VOLUMES/models/tiny-llama-gguf" --llama-tokenizer
# The GGUF formats run llama.cpp's converters: the trainer image has them at /opt/llama.cpp, the
# node agent hands its pods the cache's copy (unpacked once from the pinned sdist, seconds).
python -m hack.llama_cpp converters >/dev/null

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
CURVE=$(kubectl -n "$NS" get finetunejob "$JOB" -o jsonpath='{.status.output.lossCurvePath}')
CLAIM=$(kubectl -n "$NS" get finetunejob "$JOB" -o jsonpath='{.status.output.claimName}')
PROMPT=$(kubectl -n "$NS" get finetunejob "$JOB" -o jsonpath='{.status.sample.prompt}')
ANSWER=$(kubectl -n "$NS" get finetunejob "$JOB" -o jsonpath='{.status.sample.answer}')
# The pod sees the output claim at /mnt/output; on this machine the claim is a local folder.
LOCAL_ADAPTER=$VOLUMES/${CLAIM:-outputs}/${ADAPTER#/mnt/output/}
LOCAL_CURVE=$VOLUMES/${CLAIM:-outputs}/${CURVE#/mnt/output/}
[ -d "$LOCAL_ADAPTER" ] || fail "adapter folder $LOCAL_ADAPTER (status.output.adapterPath=$ADAPTER) does not exist"
[ -s "$LOCAL_CURVE" ] || fail "loss curve $LOCAL_CURVE (status.output.lossCurvePath=$CURVE) was not written"
[ -n "$ANSWER" ] || fail "the sample answer (status.sample.answer) is empty"
ls -l "$LOCAL_ADAPTER"

ELAPSED=$(( $(date +%s) - STARTED ))
cat <<DONE

Adapter:     $ADAPTER on PVC ${CLAIM:-outputs} (here: ${LOCAL_ADAPTER#$ROOT/})
Loss curve:  $CURVE, drawn by the trainer (here: ${LOCAL_CURVE#$ROOT/})
Sample:      $(printf '%q' "$PROMPT") -> $(printf '%q' "$ANSWER")
Demo took ${ELAPSED}s.

Look around (the cluster keeps running):
  export KUBECONFIG=$KUBECONFIG PATH=$ROOT/.cache/cluster/bin:$ROOT/.venv/bin:\$PATH
  kubectl get ftj -n $NS
  kubectl describe ftj $JOB -n $NS
  kubectl get jobs,pods -n $NS -l finetune.dev/job=$JOB
  kubectl get events -n $NS --field-selector involvedObject.name=$JOB
  ftjob status $JOB -n $NS
  kubectl apply -n $NS -f examples/dpo-tiny.yaml    # orpo-tiny.yaml, tiny-gguf.yaml: their data is in place
  helm status $RELEASE -n $OPERATOR_NS
When done:
  make cluster-down
DONE
