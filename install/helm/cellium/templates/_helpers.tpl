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

{{/* The chart's CA for the Hubble certificates (hubble.tls.auto, method
helm), made once per render and kept on the root context for every template
that issues a certificate: tls.ca.cert and tls.ca.key when given, else the
CA of the Secret cilium-ca when the cluster has it (helm upgrade keeps it;
helm template sees no cluster), else a new one. Call it as
  {{- $_ := include "cellium.ca.setup" . -}}
then use .celliumCA. */}}
{{- define "cellium.ca.setup" -}}
{{- if not .celliumCA -}}
{{- $ca := "" -}}
{{- if and .Values.tls.ca.cert .Values.tls.ca.key -}}
{{- $ca = buildCustomCert .Values.tls.ca.cert .Values.tls.ca.key -}}
{{- else -}}
{{- with lookup "v1" "Secret" .Release.Namespace "cilium-ca" -}}
{{- $ca = buildCustomCert (index .data "ca.crt") (index .data "ca.key") -}}
{{- else -}}
{{- $ca = genCA "Cellium CA" (.Values.tls.ca.certValidityDuration | int) -}}
{{- end -}}
{{- end -}}
{{- $_ := set . "celliumCA" $ca -}}
{{- end -}}
{{- end -}}

{{/* Whether the agents serve the Hubble API on TCP (hubble.listenAddress),
checked against hubble.peerService.targetPort: "true" or "". */}}
{{- define "cellium.hubble.tcp" -}}
{{- if and .Values.hubble.enabled .Values.hubble.listenAddress -}}
{{- $port := regexFind "[0-9]+$" .Values.hubble.listenAddress -}}
{{- if ne $port (toString .Values.hubble.peerService.targetPort) -}}
{{- fail (printf "hubble.listenAddress=%q and hubble.peerService.targetPort=%v disagree: the hubble-peer Service sends hubble-relay to the agents' port, so give listenAddress the port %v (or set targetPort to its port)" .Values.hubble.listenAddress .Values.hubble.peerService.targetPort .Values.hubble.peerService.targetPort) -}}
{{- end -}}
true
{{- end -}}
{{- end -}}

{{/* Whether the chart issues the Hubble certificates with Helm ("true" or
""); a method other than helm is refused. */}}
{{- define "cellium.hubble.autoTLS" -}}
{{- if and (include "cellium.hubble.tcp" .) .Values.hubble.tls.enabled .Values.hubble.tls.auto.enabled -}}
{{- if ne .Values.hubble.tls.auto.method "helm" -}}
{{- fail (printf "hubble.tls.auto.method=%q: cellium's chart issues the Hubble certificates with Helm only: set hubble.tls.auto.method=helm, or hubble.tls.auto.enabled=false and create the Secrets hubble-server-certs and hubble-relay-client-certs yourself" .Values.hubble.tls.auto.method) -}}
{{- end -}}
true
{{- end -}}
{{- end -}}

{{/* The relay's image. */}}
{{- define "cellium.relayImage" -}}
{{ .Values.hubble.relay.image.repository }}:{{ .Values.hubble.relay.image.tag }}
{{- end -}}

{{/* The hubble-peer Service's port: 443 with TLS, else 80 (Cilium's). */}}
{{- define "cellium.hubble.peerPort" -}}
{{- .Values.hubble.tls.enabled | ternary 443 80 -}}
{{- end -}}

{{/* Where the agent's container finds its Hubble certificate. */}}
{{- define "cellium.hubble.tlsDir" -}}
/var/lib/cellium/tls/hubble
{{- end -}}
