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

{{/* KUBERNETES_SERVICE_HOST and _PORT of the agent and the operator when
k8sServiceHost is set: they run in the host network and reach the API server
directly, not through the kubernetes Service (which needs kube-proxy or
cellium's own service load balancing first). */}}
{{- define "cellium.k8sServiceEnv" -}}
{{- if .Values.k8sServiceHost -}}
- name: KUBERNETES_SERVICE_HOST
  value: {{ .Values.k8sServiceHost | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ .Values.k8sServicePort | toString | quote }}
{{- end -}}
{{- end -}}
