// Package hubble turns the agent's datapath events into Hubble flows (the
// flow.Flow protobuf type of github.com/cilium/cilium's api/v1/flow) and
// hands each one to the sinks that keep or count them: the ring buffer
// the Observer gRPC service reads, and Hubble's flow metrics.
package hubble

import (
	flowpb "github.com/cilium/cilium/api/v1/flow"

	"github.com/cellium/cellium/cells/hive"
)

// Sink receives every flow the agent makes, in order, from a single
// goroutine. Implementations must not block (a sink that has to wait
// drops and counts instead) and must treat the flow as immutable: the same
// *flowpb.Flow is handed to every sink.
type Sink interface {
	// OnFlow is called once per flow.
	OnFlow(f *flowpb.Flow)
	// OnLost reports datapath events lost before they became flows (the
	// monitor subscription overflowed, or the datapath's ring buffer did).
	OnLost(l *flowpb.LostEvent)
}

// SinkOut provides a Sink to the flow producer; a cell that wants flows
// returns it from a constructor.
type SinkOut struct {
	hive.Out
	Sink Sink `group:"hubble-sinks"`
}

// SinksIn is what the flow producer takes: every provided Sink.
type SinksIn struct {
	hive.In
	Sinks []Sink `group:"hubble-sinks"`
}
