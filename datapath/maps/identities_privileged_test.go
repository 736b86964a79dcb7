package maps_test

import (
	"slices"
	"testing"

	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/test/privileged"
)

// cellium_identities: Add, Has, Remove, and Sync making the set exactly
// the wanted one.
func TestPrivilegedIdentitiesOps(t *testing.T) {
	privileged.Require(t)
	m, err := maps.Open(tempBPFFS(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	s := m.Identities
	if err := s.Add(1001); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Has(1001); err != nil || !ok {
		t.Fatalf("Has(1001) = %v, %v", ok, err)
	}
	if err := s.Remove(1001); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(1001); err != nil {
		t.Errorf("removing a missing identity: %v", err)
	}
	_ = s.Add(7)
	added, removed, err := s.Sync(map[identity.NumericIdentity]bool{256: true, 65536: true})
	if err != nil || added != 2 || removed != 1 {
		t.Fatalf("Sync: added %d removed %d err %v; want 2, 1", added, removed, err)
	}
	all, err := s.All()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(all)
	if !slices.Equal(all, []identity.NumericIdentity{256, 65536}) {
		t.Errorf("set = %v, want [256 65536]", all)
	}
}
