package harness

import (
	"os"
	"path/filepath"
	"testing"
)

// ReadAuditLog reads the API server's JSON lines: who wrote what, with
// the subresource and the answer; a missing log has no events.
func TestReadAuditLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), AuditLogFile)
	if evs, err := ReadAuditLog(path); err != nil || len(evs) != 0 {
		t.Fatalf("missing log: %v, %v", evs, err)
	}
	log := `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a1","stage":"ResponseComplete","requestURI":"/apis/cilium.io/v2/namespaces/ns/ciliumendpoints","verb":"create","user":{"username":"system:serviceaccount:kube-system:cellium-agent","groups":["system:serviceaccounts"]},"userAgent":"cellium-agent","objectRef":{"resource":"ciliumendpoints","namespace":"ns","name":"web","apiGroup":"cilium.io","apiVersion":"v2"},"responseStatus":{"metadata":{},"code":201}}

{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a2","stage":"ResponseComplete","verb":"patch","user":{"username":"cellium-admin"},"objectRef":{"resource":"ciliumnodes","subresource":"status","name":"n1","apiGroup":"cilium.io"},"responseStatus":{"code":409}}
`
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	evs, err := ReadAuditLog(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 {
		t.Fatalf("%d events, want 2", len(evs))
	}
	if e := evs[0]; e.Verb != "create" || e.User.Username != "system:serviceaccount:kube-system:cellium-agent" ||
		e.Resource() != "ciliumendpoints" || e.ObjectRef.Name != "web" || e.Code() != 201 || e.Stage != "ResponseComplete" {
		t.Errorf("first event %+v", e)
	}
	if e := evs[1]; e.Resource() != "ciliumnodes/status" || e.Code() != 409 {
		t.Errorf("second event %+v", e)
	}
	if err := os.WriteFile(path, []byte("not json\n"), 0o644); err == nil {
		if _, err := ReadAuditLog(path); err == nil {
			t.Error("a broken line was read")
		}
	}
}
