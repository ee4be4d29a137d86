{{- define "warren.name" -}}warren{{- end -}}

{{- define "warren.fullname" -}}
{{- if contains "warren" .Release.Name -}}{{ .Release.Name | trunc 40 | trimSuffix "-" }}{{- else -}}{{ printf "%s-warren" .Release.Name | trunc 40 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "warren.image" -}}{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}{{- end -}}

{{- define "warren.labels" -}}
app.kubernetes.io/name: {{ include "warren.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "warren.selector" -}}
app.kubernetes.io/name: {{ include "warren.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Hardened container settings for the operator and the gateway. */}}
{{- define "warren.restricted" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities: {drop: [ALL]}
  seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{/* The namespace holding only the published keys. */}}
{{- define "warren.keysNamespace" -}}{{ .Values.keysNamespace.name | default (printf "%s-keys" .Release.Namespace) }}{{- end -}}
