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

{{/*
Mutual TLS between gateways and agents: what this render does with the
certificates. Deterministic within one render (it reads only the cluster's
current Secrets and the clock), so the Secrets and the pods' revision
annotations agree. Output (YAML): rotateCA, rotateLeaves, revision.
A certificate is renewed when less than rotateBeforeDays of it remain.
*/}}
{{- define "warren.tls.plan" -}}
{{- $full := include "warren.fullname" . -}}
{{- $now := now | unixEpoch | int64 -}}
{{- $window := mul .Values.tls.rotateBeforeDays 86400 | int64 -}}
{{- $ca := lookup "v1" "Secret" .Release.Namespace (printf "%s-tls-ca" $full) -}}
{{- $agent := lookup "v1" "Secret" .Release.Namespace (printf "%s-node-agent-tls" $full) -}}
{{- $gateway := lookup "v1" "Secret" .Release.Namespace (printf "%s-gateway-tls" $full) -}}
{{- $rotateCA := true -}}
{{- if $ca -}}
{{- $notAfter := index ($ca.metadata.annotations | default dict) "warren.dev/not-after" | default "0" | int64 -}}
{{- if gt (sub $notAfter $now) $window -}}{{- $rotateCA = false -}}{{- end -}}
{{- end -}}
{{- $rotateLeaves := true -}}
{{- $revision := 1 -}}
{{- if and $agent $gateway -}}
{{- $a := $agent.metadata.annotations | default dict -}}
{{- $g := $gateway.metadata.annotations | default dict -}}
{{- $notAfter := min (index $a "warren.dev/not-after" | default "0" | int64) (index $g "warren.dev/not-after" | default "0" | int64) -}}
{{- $revision = index $a "warren.dev/revision" | default "0" | int64 -}}
{{- if and (not $rotateCA) (gt (sub $notAfter $now) $window) -}}{{- $rotateLeaves = false -}}{{- else -}}{{- $revision = add1 $revision -}}{{- end -}}
{{- end -}}
rotateCA: {{ $rotateCA }}
rotateLeaves: {{ $rotateLeaves }}
revision: {{ $revision | quote }}
{{- end -}}

{{/* The revision of the TLS material, as a pod annotation: pods roll when it changes. */}}
{{- define "warren.tls.revision" -}}
{{- if and .Values.tls.existingSecrets.agent .Values.tls.existingSecrets.gateway -}}external{{- else -}}{{ (include "warren.tls.plan" . | fromYaml).revision }}{{- end -}}
{{- end -}}

{{/* Secret names holding each side's TLS files. */}}
{{- define "warren.tls.agentSecret" -}}{{ .Values.tls.existingSecrets.agent | default (printf "%s-node-agent-tls" (include "warren.fullname" .)) }}{{- end -}}
{{- define "warren.tls.gatewaySecret" -}}{{ .Values.tls.existingSecrets.gateway | default (printf "%s-gateway-tls" (include "warren.fullname" .)) }}{{- end -}}
