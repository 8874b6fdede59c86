{{/* Names and labels shared by every object of the chart. */}}

{{- define "sandboxd.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "sandboxd.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Selector labels: stable across upgrades (a selector cannot change). */}}
{{- define "sandboxd.nodeSelectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: node
{{- end -}}

{{- define "sandboxd.gatewaySelectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end -}}

{{- define "sandboxd.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "sandboxd.adminSecret" -}}
{{- .Values.adminKey.existingSecret | default (printf "%s-admin" (include "sandboxd.fullname" .)) -}}
{{- end -}}

{{- define "sandboxd.nodeService" -}}
{{ include "sandboxd.fullname" . }}-node
{{- end -}}


{{/* SANDBOXD_STORE_POSTGRES_URL from store.postgresUrlSecret: the URL may
     carry a password, so it never goes through the ConfigMap. */}}
{{- define "sandboxd.postgresEnv" -}}
{{- with .Values.store.postgresUrlSecret }}
{{- if .name }}
- name: SANDBOXD_STORE_POSTGRES_URL
  valueFrom:
    secretKeyRef:
      name: {{ .name }}
      key: {{ .key }}
{{- end }}
{{- end }}
{{- end -}}
