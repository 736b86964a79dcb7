package doctor_test

import (
	"errors"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/doctor"
	"github.com/cellium/cellium/statedb/bpfprog"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/mapstate"
	"github.com/cellium/cellium/statedb/reconciler"
)

// programTests are TestCheck's cases of the eBPF program checks.
func programTests() []struct {
	name string
	f    doctor.Facts
	want []string
} {
	withVeth := func(ep *endpoints.Endpoint, state ciliumv2.EndpointState) *endpoints.Endpoint {
		ep.HostIfName, ep.HostIfIndex, ep.State = "lxc1", 7, state
		return ep
	}
	ready := withVeth(podEP(1, "a", "10.0.0.5", 1000), ciliumv2.EndpointStateReady)
	regenerating := withVeth(podEP(2, "b", "10.0.0.6", 1001), ciliumv2.EndpointStateRegenerating)
	noVeth := podEP(3, "c", "10.0.0.7", 1002)
	noVeth.State = ciliumv2.EndpointStateReady
	row := func(ep *endpoints.Endpoint, st reconciler.Status) *bpfprog.Program {
		return bpfprog.Derive(ep, false).WithStatus(st)
	}
	stale := row(ready, reconciler.Done())
	stale.Identity = 999
	return []struct {
		name string
		f    doctor.Facts
		want []string
	}{
		{
			name: "programs attached, or none wanted: nothing to say",
			f: doctor.Facts{Endpoints: []*endpoints.Endpoint{ready, noVeth}, ProgramsKnown: true,
				Programs: []*bpfprog.Program{row(ready, reconciler.Done())}},
		},
		{
			name: "a failed load; a ready endpoint without programs",
			f: doctor.Facts{Endpoints: []*endpoints.Endpoint{ready, regenerating}, ProgramsKnown: true,
				Programs: []*bpfprog.Program{row(regenerating, reconciler.Failed(errors.New("the kernel's BPF verifier rejected the program: load program: permission denied\n\tR5 !read_ok")))}},
			want: []string{
				"endpoint-programs-failed endpoint 2 (default/b): fail to load: the kernel's BPF verifier rejected the program",
				"endpoint-ready-without-programs endpoint 1 (default/a): is ready but its eBPF programs are not attached for identity 1000",
			},
		},
		{
			name: "programs of an older identity",
			f: doctor.Facts{Endpoints: []*endpoints.Endpoint{ready}, ProgramsKnown: true,
				Programs: []*bpfprog.Program{stale}},
			want: []string{"endpoint-ready-without-programs endpoint 1 (default/a): not attached for identity 1000"},
		},
	}
}

// policyMapTests are TestCheck's cases of the policy map check.
func policyMapTests() []struct {
	name string
	f    doctor.Facts
	want []string
} {
	ep := podEP(4, "d", "10.0.0.8", 1003)
	ep.State = ciliumv2.EndpointStateNotReady
	row := func(id identity.NumericIdentity, st reconciler.Status) *mapstate.PolicyMap {
		return &mapstate.PolicyMap{EndpointID: 4, Identity: id, Revision: 7, Status: st}
	}
	overflow := reconciler.Failed(errors.New("policy map of endpoint 4 (revision 7): 20000 entries do not fit the map (at most 16384): policy larger than the policy map"))
	return []struct {
		name string
		f    doctor.Facts
		want []string
	}{
		{
			name: "policy map done, or failing for an older identity: nothing to say",
			f: doctor.Facts{Endpoints: []*endpoints.Endpoint{ep}, PolicyMapsKnown: true,
				PolicyMaps: []*mapstate.PolicyMap{row(999, overflow)}},
		},
		{
			name: "a policy map that overflows",
			f: doctor.Facts{Endpoints: []*endpoints.Endpoint{ep}, PolicyMapsKnown: true,
				PolicyMaps: []*mapstate.PolicyMap{row(1003, overflow)}},
			want: []string{"endpoint-policy-map-failed endpoint 4 (default/d): does not hold its policy (revision 7): policy map of endpoint 4 (revision 7): 20000 entries do not fit"},
		},
	}
}
