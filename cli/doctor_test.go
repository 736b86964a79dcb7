package cli

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/agentapi"
)

// doctorAgent serves report as GET /v1/doctor.
func doctorAgent(t *testing.T, report models.DoctorReport) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "cli")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "cellium.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/doctor", func(w http.ResponseWriter, r *http.Request) { agentapi.WriteJSON(w, r, report) })
	srv := httptest.NewUnstartedServer(mux)
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return sock
}

func TestDoctorClean(t *testing.T) {
	sock := doctorAgent(t, models.DoctorReport{Findings: []models.DoctorFinding{}})
	r := run(t, sock, "doctor")
	if r.code != 0 || !strings.Contains(r.stdout, "No problems found") {
		t.Errorf("doctor on a clean node: %+v", r)
	}
	r = run(t, sock, "doctor", "-o", "json")
	var rep models.DoctorReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); r.code != 0 || err != nil || rep.Findings == nil || len(rep.Findings) != 0 {
		t.Errorf("doctor -o json on a clean node: %+v (%v)", r, err)
	}
	if !strings.Contains(r.stdout, `"findings": []`) {
		t.Errorf("-o json prints %q: want an empty list, not null", r.stdout)
	}
}

func TestDoctorFindings(t *testing.T) {
	report := models.DoctorReport{
		Findings: []models.DoctorFinding{
			{Kind: "leaked-ip", Object: "10.0.0.9", Message: "10.0.0.9 is allocated to \"default/gone\" but no endpoint uses it", Hint: "free it"},
			{Kind: "orphan-veth", Object: "lxc1", Message: "host interface lxc1 belongs to no endpoint", Hint: "ip link del lxc1"},
		},
		Skipped: []string{"pods: the pods table is not synced with the API server yet"},
	}
	sock := doctorAgent(t, report)
	r := run(t, sock, "doctor")
	if r.code != 1 || !strings.Contains(r.stderr, "the doctor found 2 problem(s)") {
		t.Errorf("doctor with findings: code %d, stderr %q", r.code, r.stderr)
	}
	golden(t, "doctor", r.stdout)

	for _, format := range []string{"json", "yaml"} {
		r = run(t, sock, "doctor", "-o", format)
		if r.code != 1 {
			t.Errorf("-o %s: code %d, want 1", format, r.code)
		}
		if format == "json" {
			var got models.DoctorReport
			if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || len(got.Findings) != 2 || got.Findings[1].Kind != "orphan-veth" {
				t.Errorf("-o json printed %q (%v)", r.stdout, err)
			}
		} else if !strings.Contains(r.stdout, "- hint: free it") {
			t.Errorf("-o yaml printed %q", r.stdout)
		}
	}
}
