{{/* The chart's name, and the release's full name: object names are cut to 63 characters (DNS labels). */}}
{{- define "dbvt-server.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "dbvt-server.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "dbvt-server.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "dbvt-server.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* The headless Service: it gives each pod its stable DNS name, <pod>.<headless>.<namespace>.svc.<domain>. */}}
{{- define "dbvt-server.headless" -}}
{{- printf "%s-headless" (include "dbvt-server.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The DNS suffix after a pod's name: .<headless>.<namespace>.svc.<domain> */}}
{{- define "dbvt-server.podDomain" -}}
{{- printf ".%s.%s.svc.%s" (include "dbvt-server.headless" .) .Release.Namespace .Values.clusterDomain }}
{{- end }}

{{/* DBVT_PEERS: every replica's stable name and gRPC port, comma-separated, in ordinal order. */}}
{{- define "dbvt-server.peers" -}}
{{- $fullname := include "dbvt-server.fullname" . }}
{{- $suffix := printf "%s:%d" (include "dbvt-server.podDomain" .) (int .Values.ports.grpc) }}
{{- $peers := list }}
{{- range $i := until (int .Values.replicas) }}
{{- $peers = append $peers (printf "%s-%d%s" $fullname $i $suffix) }}
{{- end }}
{{- join "," $peers }}
{{- end }}

{{- define "dbvt-server.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dbvt-server.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "dbvt-server.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "dbvt-server.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}
