{{/* etcd.enabled (Cilium's values and paths): agent and operator read the
etcd client file /var/lib/etcd-config/etcd.config (the etcd-config key of
the ConfigMap cilium-config); with etcd.ssl its TLS files come from the
Secret cilium-etcd-secrets, mounted at /var/lib/etcd-secrets. */}}
{{- define "cellium.etcd.args" -}}
{{- if .Values.etcd.enabled -}}
- --kvstore=etcd
- --kvstore-opt=etcd.config=/var/lib/etcd-config/etcd.config
{{- end -}}
{{- end -}}

{{- define "cellium.etcd.volumeMounts" -}}
{{- if .Values.etcd.enabled -}}
- name: etcd-config-path
  mountPath: /var/lib/etcd-config
  readOnly: true
{{- if .Values.etcd.ssl }}
- name: etcd-secrets
  mountPath: /var/lib/etcd-secrets
  readOnly: true
{{- end }}
{{- end -}}
{{- end -}}

{{- define "cellium.etcd.volumes" -}}
{{- if .Values.etcd.enabled -}}
- name: etcd-config-path
  configMap:
    name: cilium-config
    defaultMode: 0400
    items:
      - key: etcd-config
        path: etcd.config
{{- if .Values.etcd.ssl }}
- name: etcd-secrets
  secret:
    secretName: cilium-etcd-secrets
    defaultMode: 0400
    optional: true
{{- end }}
{{- end -}}
{{- end -}}
