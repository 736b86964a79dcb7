package endpointmanager_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/cellium/cellium/api/v1/models"
)

// raw sends body as it is and returns the status and the error message
// (or the body when it is not an API error).
func (e *env) raw(t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://agent/v1"+path, strings.NewReader(body))
	resp, err := e.api.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var apiErr models.Error
	if err := json.Unmarshal(data, &apiErr); err == nil && apiErr.Message != "" {
		return resp.StatusCode, apiErr.Message
	}
	return resp.StatusCode, string(data)
}

// TestAPIInputLimits: each limit of the endpoint API answers 400 with a
// message naming what was wrong, and nothing is created.
func TestAPIInputLimits(t *testing.T) {
	e := start(t, t.TempDir(), nil, nil)
	valid := `{"container-id":"c1","container-interface-name":"eth0","k8s-namespace":"default","k8s-pod-name":"p","interface-name":"lxc1","addressing":{"ipv4":"10.0.0.9"}}`
	long := func(n int) string { return strings.Repeat("a", n) }
	tests := []struct {
		name, method, path, body string
		code                     int
		want                     string
	}{
		{"unknown field", "PUT", "/endpoint", strings.TrimSuffix(valid, "}") + `,"surprise":true}`, 400, `unknown field "surprise"`},
		{"trailing data", "PUT", "/endpoint", valid + `{"container-id":"c2"}`, 400, "unexpected data after the JSON object"},
		{"long container ID", "PUT", "/endpoint", strings.Replace(valid, `"c1"`, `"`+long(models.MaxContainerIDLen+1)+`"`, 1), 400, "container-id is 257 bytes long, the limit is 256"},
		{"long pod name", "PUT", "/endpoint", strings.Replace(valid, `"p"`, `"`+long(254)+`"`, 1), 400, "k8s-pod-name is 254 bytes long"},
		{"long interface", "PUT", "/endpoint", strings.Replace(valid, `"lxc1"`, `"`+long(16)+`"`, 1), 400, "interface-name is 16 bytes long, the limit is 15"},
		{"long netns", "PUT", "/endpoint", strings.TrimSuffix(valid, "}") + `,"netns-path":"/` + long(models.MaxPathLen) + `"}`, 400, "netns-path is 4097 bytes long"},
		{"huge body", "PUT", "/endpoint", `{"container-id":"` + long(2<<20) + `"}`, 413, "larger than the limit of 1048576 bytes"},
		{"ID 0", "GET", "/endpoint/0", "", 400, `endpoint ID "0": want a number from 1 to 4095`},
		{"ID 4096", "GET", "/endpoint/4096", "", 400, `endpoint ID "4096": want a number from 1 to 4095`},
		{"ID 65535", "DELETE", "/endpoint/65535", "", 400, "want a number from 1 to 4095"},
		{"ID 70000 regenerate", "POST", "/endpoint/70000/regenerate", "", 400, "want a number from 1 to 4095"},
		{"long container-id query", "DELETE", "/endpoint?container-id=" + long(300), "", 400, "container-id is 300 bytes long, the limit is 256"},
		{"missing container-id query", "DELETE", "/endpoint", "", 400, "container-id is missing"},
		{"patch unknown field", "PATCH", "/endpoint/1/labels", `{"add":{"a":"b"},"remove":["c"]}`, 400, `unknown field "remove"`},
		{"patch trailing data", "PATCH", "/endpoint/1/labels", `{"add":{"a":"b"}} x`, 400, "unexpected data after the JSON object"},
		{"patch long value", "PATCH", "/endpoint/1/labels", `{"add":{"a":"` + long(models.MaxLabelValueLen+1) + `"}}`, 400, `value of label "a" is 257 bytes long`},
	}
	for _, tt := range tests {
		code, body := e.raw(t, tt.method, tt.path, tt.body)
		if code != tt.code || !strings.Contains(body, tt.want) {
			t.Errorf("%s: %s %s = %d %.300q, want %d with %q", tt.name, tt.method, tt.path, code, body, tt.code, tt.want)
		}
	}
	var eps []models.Endpoint
	if code := e.do(t, "GET", "/endpoint", nil, &eps); code != 200 {
		t.Fatalf("GET /endpoint = %d", code)
	}
	for _, ep := range eps {
		if ep.Spec != nil {
			t.Errorf("a rejected request created endpoint %d", ep.ID)
		}
	}
}
