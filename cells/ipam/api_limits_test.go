package ipam_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/cellium/cellium/api/v1/models"
)

// TestAPIOwnerLength: an owner longer than "namespace/pod" can be is
// refused with 400 and nothing is allocated.
func TestAPIOwnerLength(t *testing.T) {
	e := startIPAM(t, t.TempDir())
	e.setCiliumNode(t, "node1", "10.0.7.0/24")
	owner := "default/" + strings.Repeat("p", models.MaxOwnerLen)
	if code := e.do(t, "POST", "/v1/ipam?owner="+owner, nil); code != http.StatusBadRequest {
		t.Errorf("POST /v1/ipam with a %d-byte owner = %d, want 400", len(owner), code)
	}
	var list []models.IPAMAddress
	if code := e.do(t, "GET", "/v1/ipam", &list); code != 200 {
		t.Fatalf("GET /v1/ipam = %d", code)
	}
	for _, a := range list {
		if len(a.Owner) > models.MaxOwnerLen {
			t.Errorf("%s was allocated to a %d-byte owner", a.IP, len(a.Owner))
		}
	}
	if code := e.do(t, "POST", "/v1/ipam?owner=default/"+strings.Repeat("p", 253), nil); code != http.StatusCreated {
		t.Errorf("POST /v1/ipam with the longest valid owner = %d, want 201", code)
	}
}
