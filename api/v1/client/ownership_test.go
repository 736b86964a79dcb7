package client

import (
	"context"
	"net/http"
	"reflect"
	"testing"

	"github.com/cellium/cellium/api/v1/models"
)

// TestOwnershipMethods checks the requests of the calls that carry a
// container ID, and how their answers map to results.
func TestOwnershipMethods(t *testing.T) {
	c, seen := serve(t, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPost:
			writeJSON(w, http.StatusCreated, models.IPAMResponse{IPv4: &models.IPAMAddress{IP: "10.0.0.5", ContainerID: "c1"}})
		case r.URL.Query().Get("container-id") == "gone":
			writeJSON(w, http.StatusNotFound, models.Error{Code: 404, Message: "nothing held"})
		case r.URL.Query().Get("container-id") == "other":
			writeJSON(w, http.StatusConflict, models.Error{Code: 409, Message: "held by c1"})
		default:
			w.WriteHeader(http.StatusOK)
		}
	})
	ctx := context.Background()
	if r, err := c.AllocateIP(ctx, "default/pod-a", "c1"); err != nil || r.IPv4.ContainerID != "c1" {
		t.Errorf("AllocateIPForContainer = %+v, %v", r, err)
	}
	if ok, err := c.ReleaseContainerIP(ctx, "10.0.0.5", "c1"); !ok || err != nil {
		t.Errorf("ReleaseContainerIP = %v, %v", ok, err)
	}
	if ok, err := c.ReleaseContainerIP(ctx, "10.0.0.5", "gone"); ok || err != nil {
		t.Errorf("ReleaseContainerIP of a free address = %v, %v; want false, nil", ok, err)
	}
	if ok, err := c.ReleaseContainerIP(ctx, "10.0.0.5", "other"); ok || err == nil {
		t.Errorf("ReleaseContainerIP of another's address = %v, %v; want an error", ok, err)
	}
	if found, err := c.DeleteAttempt(ctx, "c1", "10.0.0.5"); !found || err != nil {
		t.Errorf("DeleteAttempt = %v, %v", found, err)
	}
	if found, err := c.DeleteAttempt(ctx, "gone", "10.0.0.5"); found || err != nil {
		t.Errorf("DeleteAttempt with nothing held = %v, %v; want false, nil", found, err)
	}
	want := []request{
		{Method: "POST", Path: "/v1/ipam", Query: "container-id=c1&owner=default%2Fpod-a"},
		{Method: "DELETE", Path: "/v1/ipam/10.0.0.5", Query: "container-id=c1"},
		{Method: "DELETE", Path: "/v1/ipam/10.0.0.5", Query: "container-id=gone"},
		{Method: "DELETE", Path: "/v1/ipam/10.0.0.5", Query: "container-id=other"},
		{Method: "DELETE", Path: "/v1/endpoint", Query: "container-id=c1&ip=10.0.0.5"},
		{Method: "DELETE", Path: "/v1/endpoint", Query: "container-id=gone&ip=10.0.0.5"},
	}
	if !reflect.DeepEqual(*seen, want) {
		t.Errorf("requests:\n got %+v\nwant %+v", *seen, want)
	}
}
