{{/*
Names and labels. The full name and the selector labels are the Go project's chart's, so
that `helm upgrade` of a release installed from it keeps the DaemonSet (whose selector
cannot change) and the Service name its ScaledObjects use.
*/}}
{{- define "keda-gpu-scaler.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "keda-gpu-scaler.fullname" -}}
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

{{- define "keda-gpu-scaler.selectorLabels" -}}
app.kubernetes.io/name: {{ include "keda-gpu-scaler.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
No helm.sh/chart or managed-by label: k8s/base is this chart's output, applied by
kubectl as well as by Helm.
*/}}
{{- define "keda-gpu-scaler.labels" -}}
{{ include "keda-gpu-scaler.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: keda-gpu-scaler
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "keda-gpu-scaler.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "keda-gpu-scaler.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "keda-gpu-scaler.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/*
Pod attribution's RBAC: one ClusterRole and its binding, named after the release.
*/}}
{{- define "keda-gpu-scaler.rbacEnabled" -}}
{{- if and .Values.podAttribution.enabled .Values.rbac.create }}true{{ end }}
{{- end }}

{{- define "keda-gpu-scaler.podResourcesSocket" -}}
{{ .Values.podAttribution.socketDir }}/kubelet.sock
{{- end }}

{{/*
The cluster scaler (role: cluster). Its pods carry an instance label of their own, so that
neither the DaemonSet's selector (name and instance: the Go project's chart's, which cannot
change) nor the agents' Services ever select them.
*/}}
{{- define "keda-gpu-scaler.cluster" -}}
{{- if eq .Values.role "cluster" }}true{{ end }}
{{- end }}

{{- define "keda-gpu-scaler.clusterName" -}}
{{- printf "%s-cluster" (include "keda-gpu-scaler.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "keda-gpu-scaler.clusterSelectorLabels" -}}
app.kubernetes.io/name: {{ include "keda-gpu-scaler.name" . }}
app.kubernetes.io/instance: {{ printf "%s-cluster" .Release.Name | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/component: cluster-scaler
{{- end }}

{{- define "keda-gpu-scaler.clusterLabels" -}}
{{ include "keda-gpu-scaler.clusterSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: keda-gpu-scaler
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The node agents' pods, as the cluster scaler's discovery and the NetworkPolicy select them. */}}
{{- define "keda-gpu-scaler.agentSelectorLabels" -}}
{{ include "keda-gpu-scaler.selectorLabels" . }}
app.kubernetes.io/component: node-agent
{{- end }}
