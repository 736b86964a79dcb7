package labels

import (
	"slices"
	"testing"
)

func TestFromK8sPod(t *testing.T) {
	tests := []struct {
		name           string
		pod, ns        map[string]string
		namespace      string
		serviceAccount string
		cluster        string
		want           []string
	}{
		{
			name:           "typical deployment pod",
			pod:            map[string]string{"app": "web", "pod-template-hash": "5d8f"},
			ns:             map[string]string{"kubernetes.io/metadata.name": "prod", "team": "a"},
			namespace:      "prod",
			serviceAccount: "web-sa",
			cluster:        "c1",
			want: []string{
				"k8s:app=web",
				"k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=prod",
				"k8s:io.cilium.k8s.namespace.labels.team=a",
				"k8s:io.cilium.k8s.policy.cluster=c1",
				"k8s:io.cilium.k8s.policy.serviceaccount=web-sa",
				"k8s:io.kubernetes.pod.namespace=prod",
				"k8s:pod-template-hash=5d8f",
			},
		},
		{
			name:      "no service account, default cluster name",
			pod:       map[string]string{"app": "web"},
			namespace: "default",
			want: []string{
				"k8s:app=web",
				"k8s:io.cilium.k8s.policy.cluster=default",
				"k8s:io.kubernetes.pod.namespace=default",
			},
		},
		{
			name: "pod cannot forge agent-derived labels",
			pod: map[string]string{
				"io.cilium.k8s.policy.serviceaccount": "admin",
				"io.cilium.k8s.policy.cluster":        "other",
				"io.cilium.k8s.namespace.labels.team": "forged",
				"io.kubernetes.pod.namespace":         "kube-system",
				"app":                                 "web",
			},
			namespace: "default",
			cluster:   "c1",
			want: []string{
				"k8s:app=web",
				"k8s:io.cilium.k8s.policy.cluster=c1",
				"k8s:io.kubernetes.pod.namespace=default",
			},
		},
		{
			name:      "reserved. prefix of a pod label key is dropped",
			pod:       map[string]string{"reserved.host": "x"},
			namespace: "default",
			want: []string{
				"k8s:host=x",
				"k8s:io.cilium.k8s.policy.cluster=default",
				"k8s:io.kubernetes.pod.namespace=default",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := FromK8sPod(tt.pod, tt.namespace, tt.ns, tt.serviceAccount, tt.cluster)
			if !slices.Equal(got.Strings(), tt.want) {
				t.Errorf("FromK8sPod =\n%q\nwant\n%q", got.Strings(), tt.want)
			}
			for l := range got.All() {
				if l.Source != SourceK8s {
					t.Errorf("label %v does not have source k8s", l)
				}
			}
		})
	}
}

// The identity labels of the typical pod: the chain FromK8sPod -> DefaultFilter.
func TestFromK8sPodIdentityLabels(t *testing.T) {
	all := FromK8sPod(
		map[string]string{
			"app":                                "web",
			"app.kubernetes.io/name":             "web",
			"pod-template-hash":                  "5d8f",
			"controller-revision-hash":           "abc",
			"statefulset.kubernetes.io/pod-name": "web-0",
		},
		"prod",
		map[string]string{"kubernetes.io/metadata.name": "prod"},
		"web-sa", "c1")
	id, info := DefaultFilter().Split(all)
	wantID := []string{
		"k8s:app=web",
		"k8s:app.kubernetes.io/name=web",
		"k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=prod",
		"k8s:io.cilium.k8s.policy.cluster=c1",
		"k8s:io.cilium.k8s.policy.serviceaccount=web-sa",
		"k8s:io.kubernetes.pod.namespace=prod",
	}
	wantInfo := []string{
		"k8s:controller-revision-hash=abc",
		"k8s:pod-template-hash=5d8f",
		"k8s:statefulset.kubernetes.io/pod-name=web-0",
	}
	if !slices.Equal(id.Strings(), wantID) {
		t.Errorf("identity labels =\n%q\nwant\n%q", id.Strings(), wantID)
	}
	if !slices.Equal(info.Strings(), wantInfo) {
		t.Errorf("info labels =\n%q\nwant\n%q", info.Strings(), wantInfo)
	}
}
