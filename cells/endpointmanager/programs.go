package endpointmanager

import (
	"context"
	"fmt"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/statedb/bpfprog"
	"github.com/cellium/cellium/statedb/endpoints"
)

// The endpoint's state follows its datapath when the agent loads eBPF
// programs (the bpf-programs table exists): an endpoint whose identity is
// resolved stays regenerating until the loader reports its programs
// attached for that identity (then it is ready), and a failed load (a
// verifier error, with its log) is written to the endpoint's log, which
// the CEP mirrors. Without the table (--enable-bpf-datapath=false) an
// endpoint is ready once its identity is resolved.

// wantsPrograms reports whether ep's readiness waits for its programs.
func (m *Manager) wantsPrograms(ep *endpoints.Endpoint) bool {
	return m.programs != nil && bpfprog.Derive(ep, false) != nil
}

// readyMessage is the log message of an endpoint becoming ready.
func readyMessage(ep *endpoints.Endpoint) string {
	return "Successfully regenerated endpoint program (identity " + ep.Identity.String() + ")"
}

// followPrograms moves each regenerating endpoint to ready once its
// programs are attached for its identity, and records failed loads in its
// log, until ctx ends.
func (m *Manager) followPrograms(ctx context.Context, h hive.Health) {
	for {
		txn := m.db.ReadTxn()
		eps, epWatch := m.table.AllWatch(txn)
		_, progWatch := m.programs.AllWatch(txn)
		failing := 0
		for ep := range eps {
			if ep.State != ciliumv2.EndpointStateRegenerating || !m.wantsPrograms(ep) {
				continue
			}
			switch st, msg := bpfprog.EndpointState(txn, m.programs, ep); st {
			case bpfprog.StateReady:
				if m.policies == nil {
					// Without a policy engine nothing else gates
					// readiness (with one, nextState does).
					m.setReadyIf(ep)
				}
			case bpfprog.StateFailed:
				failing++
				if ep.Failure() != programFailure(msg) {
					m.markFailed(ep.ID, programFailure(msg))
				}
			}
		}
		if failing > 0 {
			h.Degraded("endpoint programs", fmt.Errorf("%d endpoint(s) regenerating with failed programs (cellium statedb %s)", failing, bpfprog.TableName))
		} else {
			h.OK("endpoints follow their programs")
		}
		select {
		case <-ctx.Done():
			return
		case <-epWatch:
		case <-progWatch:
		}
	}
}

// programFailure is the endpoint log message of a failed program load.
func programFailure(msg string) string {
	return "Failed to load the endpoint's BPF programs: " + msg
}

// setReadyIf makes the endpoint ready if it is still what ep says
// (regenerating, same identity and interface).
func (m *Manager) setReadyIf(ep *endpoints.Endpoint) {
	err := m.modify(ep.ID, func(cur *endpoints.Endpoint) *endpoints.Endpoint {
		if !sameEndpoint(cur, ep) || cur.State != ciliumv2.EndpointStateRegenerating ||
			cur.Identity != ep.Identity || cur.HostIfName != ep.HostIfName || cur.HostIfIndex != ep.HostIfIndex {
			return nil
		}
		return cur.WithState(ciliumv2.EndpointStateReady, readyMessage(cur), m.now())
	})
	if err != nil {
		m.log.Warn("set endpoint ready", "endpoint", ep.ID, "error", err)
	}
}
