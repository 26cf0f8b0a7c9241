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
