package cepsync

import (
	"testing"
	"time"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/statedb/endpoints"
)

// An endpoint's CEP write waits while the endpoint is between resting
// states, for at most SettleMax after it entered its state: a new pod's
// CEP is created once, ready.
func TestSettling(t *testing.T) {
	created := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	ep := func(state ciliumv2.EndpointState, logged time.Time) *endpoints.Endpoint {
		e := &endpoints.Endpoint{ID: 1, Created: created, State: ciliumv2.EndpointStateWaitingForIdentity}
		if !logged.IsZero() {
			e = e.WithState(state, "test", logged)
		}
		e.State = state
		return e
	}
	for _, c := range []struct {
		name      string
		ep        *endpoints.Endpoint
		at        time.Time
		held      bool
		heldUntil time.Time
	}{
		{"regenerating, just created", ep(ciliumv2.EndpointStateRegenerating, created), created.Add(time.Second), true, created.Add(SettleMax)},
		{"waiting-to-regenerate, just created", ep(ciliumv2.EndpointStateWaitingToRegenerate, created), created, true, created.Add(SettleMax)},
		{"regenerating for too long", ep(ciliumv2.EndpointStateRegenerating, created), created.Add(SettleMax), false, created.Add(SettleMax)},
		{"regenerating again later", ep(ciliumv2.EndpointStateRegenerating, created.Add(time.Hour)), created.Add(time.Hour + time.Second), true, created.Add(time.Hour + SettleMax)},
		{"no log: since creation", ep(ciliumv2.EndpointStateRegenerating, time.Time{}), created.Add(time.Second), true, created.Add(SettleMax)},
		{"ready", ep(ciliumv2.EndpointStateReady, created), created, false, time.Time{}},
		{"not-ready", ep(ciliumv2.EndpointStateNotReady, created), created, false, time.Time{}},
		{"restoring", ep(ciliumv2.EndpointStateRestoring, created), created, false, time.Time{}},
	} {
		until, held := settling(c.ep, c.at)
		if held != c.held || !until.Equal(c.heldUntil) {
			t.Errorf("%s: settling %v until %s, want %v until %s", c.name, held, until, c.held, c.heldUntil)
		}
	}
}
