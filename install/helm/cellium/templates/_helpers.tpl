{{/* The image of all four binaries. */}}
{{- define "cellium.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* Labels on every object; component is agent or operator. */}}
{{- define "cellium.labels" -}}
app.kubernetes.io/name: cellium
app.kubernetes.io/part-of: cellium
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}
