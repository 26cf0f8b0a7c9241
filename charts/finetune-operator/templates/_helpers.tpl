{{/* Names and labels shared by every template. */}}

{{- define "finetune-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* release-chart, or the release name alone when it already contains the chart name. */}}
{{- define "finetune-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "finetune-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "finetune-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "finetune-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "finetune-operator.labels" -}}
helm.sh/chart: {{ include "finetune-operator.chart" . }}
{{ include "finetune-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: finetune-operator
{{- end }}

{{- define "finetune-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "finetune-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "finetune-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The namespaces the operator watches in namespaced mode, as a list. */}}
{{- define "finetune-operator.watchedNamespaces" -}}
{{- if not .Values.watch.namespaces }}
{{- fail "watch.namespaces: list the namespaces to watch in namespaced mode (the release namespace is one the operator never writes in)" }}
{{- end }}
{{- $excluded := include "finetune-operator.excludedNamespaces" . | fromYamlArray }}
{{- range .Values.watch.namespaces }}
{{- if has . $excluded }}
{{- fail (printf "watch.namespaces: %s is a namespace the operator never writes in (%s)" . (join ", " $excluded)) }}
{{- end }}
{{- end }}
{{- toYaml (uniq .Values.watch.namespaces) }}
{{- end }}

{{/* Namespaces the operator never writes in: the system ones, the release's, and
     watch.excludedNamespaces. The operator (FINETUNE_EXCLUDED_NAMESPACES) fails a FineTuneJob
     there, and the fence (operator-namespaces) refuses every write there. */}}
{{- define "finetune-operator.excludedNamespaces" -}}
{{- toYaml (concat (list "kube-system" "kube-public" "kube-node-lease" .Release.Namespace) (.Values.watch.excludedNamespaces | default list) | uniq) }}
{{- end }}

{{/* The operator's rules: files/operator-rbac.yaml is their single source (the tests load it too). */}}
{{- define "finetune-operator.rules" -}}
{{- $rules := .Files.Get "files/operator-rbac.yaml" | fromYamlArray }}
{{- if not $rules }}
{{- fail "files/operator-rbac.yaml is missing or holds no rules" }}
{{- end }}
{{- toYaml $rules }}
{{- end }}

{{/* The trainers' network rules (trainer.networkPolicy), rendered once as JSON: the operator
     copies them into each job's NetworkPolicy (FINETUNE_TRAINER_NETWORK), and the fence admits
     a job's policy only with these rules (finetune-fence-networkpolicies). Empty when off.
     {"egress": [API server, DNS, extraEgress...], "hubEgress": rule or null, "peerPorts": [...],
     "objectEgress": [objectStorage...]} */}}
{{- define "finetune-operator.trainerNetwork" -}}
{{- $np := .Values.trainer.networkPolicy }}
{{- if $np.enabled }}
{{- /* The API server's real addresses: policies see traffic after the Service's translation. */}}
{{- $cidrs := $np.apiServerCIDRs }}
{{- if not $cidrs }}
{{- $slice := lookup "discovery.k8s.io/v1" "EndpointSlice" "default" "kubernetes" }}
{{- range ($slice.endpoints | default list) }}
{{- range .addresses }}
{{- $cidrs = append $cidrs (ternary (printf "%s/128" .) (printf "%s/32" .) (contains ":" .)) }}
{{- end }}
{{- end }}
{{- end }}
{{- /* Not known (helm template, GitOps, or no right to read the EndpointSlice): refuse, since
     the API server's ports on any address would reopen 443 to the private ranges that the Hub
     rule leaves out. */}}
{{- if not $cidrs }}
{{- fail "trainer.networkPolicy.apiServerCIDRs: the API server's addresses could not be looked up (helm template, GitOps, or no right to read EndpointSlices); list them (kubectl get endpointslice -n default kubernetes)" }}
{{- end }}
{{- $apiTo := list }}
{{- range $cidrs }}
{{- $apiTo = append $apiTo (dict "ipBlock" (dict "cidr" .)) }}
{{- end }}
{{- $apiPorts := list }}
{{- range $np.apiServerPorts }}
{{- $apiPorts = append $apiPorts (dict "protocol" "TCP" "port" (int .)) }}
{{- end }}
{{- $dns := dict
  "to" (list (dict
    "namespaceSelector" (dict "matchLabels" (dict "kubernetes.io/metadata.name" "kube-system"))
    "podSelector" (dict "matchLabels" (dict "k8s-app" "kube-dns"))))
  "ports" (list (dict "protocol" "UDP" "port" 53) (dict "protocol" "TCP" "port" 53)) }}
{{- $egress := list (dict "to" $apiTo "ports" $apiPorts) $dns }}
{{- /* The fence compares rules as the API server stores them, so each port gets the protocol
     the API server would default (TCP). */}}
{{- range $rule := $np.extraEgress | default list }}
{{- $rule = deepCopy $rule }}
{{- if $rule.ports }}
{{- $ports := list }}
{{- range $port := $rule.ports }}
{{- $ports = append $ports (merge (deepCopy $port) (dict "protocol" "TCP")) }}
{{- end }}
{{- $_ := set $rule "ports" $ports }}
{{- end }}
{{- $egress = append $egress $rule }}
{{- end }}
{{- $hub := dict }}
{{- if $np.hubEgress.enabled }}
{{- $block := dict "cidr" "0.0.0.0/0" }}
{{- with $np.hubEgress.exceptCIDRs }}
{{- $_ := set $block "except" . }}
{{- end }}
{{- $hub = dict "to" (list (dict "ipBlock" $block)) "ports" (list (dict "protocol" "TCP" "port" 443)) }}
{{- end }}
{{- $mn := $np.multiNode }}
{{- /* 29400: the rendezvous port (finetune_api.multinode.RDZV_PORT, where the trainer listens). */}}
{{- $peerPorts := list
  (dict "protocol" "TCP" "port" 29400)
  (dict "protocol" "TCP" "port" (int $mn.collectivePorts.port) "endPort" (int $mn.collectivePorts.endPort)) }}
{{- /* The rules to the S3-compatible stores, for the pods that fetch and upload only. */}}
{{- $objects := list }}
{{- range $rule := $np.objectStorage | default list }}
{{- $rule = deepCopy $rule }}
{{- if $rule.ports }}
{{- $ports := list }}
{{- range $port := $rule.ports }}
{{- $ports = append $ports (merge (deepCopy $port) (dict "protocol" "TCP")) }}
{{- end }}
{{- $_ := set $rule "ports" $ports }}
{{- end }}
{{- $objects = append $objects $rule }}
{{- end }}
{{- dict "egress" $egress "hubEgress" (ternary $hub nil (gt (len $hub) 0)) "peerPorts" $peerPorts "objectEgress" $objects | toJson }}
{{- end }}
{{- end }}

{{/* The leader-election Lease's name: leaderElection.leaseName, else the release's full name. */}}
{{- define "finetune-operator.leaseName" -}}
{{- default (include "finetune-operator.fullname" .) .Values.leaderElection.leaseName }}
{{- end }}
