package lb

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// sessionAffinity ClientIP reaches every frontend of the Service, with
// the configured timeout or the API server's default; None (or unset)
// and changes of it alone make a frontend differ (SameAs).
func TestServiceFrontendsSessionAffinity(t *testing.T) {
	timeout := int32(2)
	for _, tc := range []struct {
		name     string
		affinity corev1.ServiceAffinity
		config   *corev1.SessionAffinityConfig
		want     bool
		timeout  uint32
	}{
		{name: "unset"},
		{name: "None", affinity: corev1.ServiceAffinityNone},
		{name: "ClientIP default", affinity: corev1.ServiceAffinityClientIP, want: true, timeout: 10800},
		{name: "ClientIP config without timeout", affinity: corev1.ServiceAffinityClientIP,
			config: &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{}}, want: true, timeout: 10800},
		{name: "ClientIP 2s", affinity: corev1.ServiceAffinityClientIP,
			config: &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &timeout}}, want: true, timeout: 2},
		{name: "None with a config", affinity: corev1.ServiceAffinityNone,
			config: &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &timeout}}},
	} {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"}, Spec: corev1.ServiceSpec{
			ClusterIP: "10.96.0.20", SessionAffinity: tc.affinity, SessionAffinityConfig: tc.config,
			Ports: []corev1.ServicePort{{Name: "a", Port: 80}, {Name: "b", Port: 53, Protocol: corev1.ProtocolUDP}},
		}}
		fes := ServiceFrontends(svc, nil)
		if len(fes) != 2 {
			t.Fatalf("%s: %d frontends, want 2", tc.name, len(fes))
		}
		for _, f := range fes {
			if f.SessionAffinity != tc.want || f.AffinityTimeout != tc.timeout {
				t.Errorf("%s: %v affinity %v %ds, want %v %ds", tc.name, f.Address, f.SessionAffinity, f.AffinityTimeout, tc.want, tc.timeout)
			}
		}
	}
	a := &Frontend{Service: "ns/s"}
	b := *a
	b.SessionAffinity, b.AffinityTimeout = true, 10800
	if a.SameAs(&b) {
		t.Error("SameAs ignores session affinity")
	}
	c := b
	c.AffinityTimeout = 2
	if b.SameAs(&c) {
		t.Error("SameAs ignores the affinity timeout")
	}
}
