{{/* Names and labels shared by every template. */}}

{{- define "streamtts.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "streamtts.fullname" -}}
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

{{- define "streamtts.selectorLabels" -}}
app.kubernetes.io/name: {{ include "streamtts.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "streamtts.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "streamtts.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "streamtts.image" -}}
{{- $flavour := ternary "cuda" "cpu" .Values.gpu.enabled }}
{{- $tag := .Values.image.tag | default (printf "%s-%s" .Chart.AppVersion $flavour) }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}

{{/* The Secret holding the API keys: the user's, or the one the chart creates. */}}
{{- define "streamtts.secretName" -}}
{{- .Values.auth.existingSecret | default (printf "%s-api-keys" (include "streamtts.fullname" .)) }}
{{- end }}

{{- define "streamtts.voicesClaim" -}}
{{- .Values.voices.persistence.existingClaim | default (printf "%s-voices" (include "streamtts.fullname" .)) }}
{{- end }}

{{- define "streamtts.cacheClaim" -}}
{{- .Values.compileCache.persistence.existingClaim | default (printf "%s-compile-cache" (include "streamtts.fullname" .)) }}
{{- end }}

{{/* Pod termination: the preStop wait, the server's drain, and 15 s for the engine to stop. */}}
{{- define "streamtts.terminationGracePeriodSeconds" -}}
{{- add .Values.shutdown.preStopSleepSeconds .Values.shutdown.graceSeconds 15 }}
{{- end }}

{{/* The autoscaling query KEDA runs: the release's live streams, summed over its pods. */}}
{{- define "streamtts.kedaQuery" -}}
{{- .Values.autoscaling.keda.query | default (printf "sum(%s{namespace=%q,service=%q})" .Values.autoscaling.metric.name .Release.Namespace (include "streamtts.fullname" .)) }}
{{- end }}

{{/* A setting's value as an environment string (whole numbers without an exponent). */}}
{{- define "streamtts.envValue" -}}
{{- if and (kindIs "float64" .) (eq (floor .) .) }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- end }}

{{/* Checks across values that values.schema.json cannot express; included by the Deployment. */}}
{{- define "streamtts.validate" -}}
{{- if lt (int .Values.autoscaling.maxReplicas) (int .Values.autoscaling.minReplicas) }}
{{- fail "autoscaling.maxReplicas must be >= autoscaling.minReplicas" }}
{{- end }}
{{- if and .Values.gpu.enabled (hasPrefix "piper" .Values.model) }}
{{- fail "gpu.enabled runs the CUDA image, which serves Fish-Speech only: set model to a checkpoint directory (e.g. /models/fish-speech-1.5)" }}
{{- end }}
{{- if and .Values.auth.existingSecret (not .Values.auth.enabled) }}
{{- fail "auth.existingSecret is set but auth.enabled is false" }}
{{- end }}
{{- end }}

{{/* The probes' scheme: the server speaks HTTPS itself when tls.existingSecret is set. */}}
{{- define "streamtts.probeScheme" -}}
{{- if .Values.tls.existingSecret }}HTTPS{{ else }}HTTP{{ end }}
{{- end }}
