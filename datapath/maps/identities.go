package maps

import (
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/cellium/cellium/statedb/identity"
)

// Identities is cellium_identities: the set of the cluster's security
// identities. cil_from_overlay accepts a tunnel packet whose VNI is in it
// (or is reserved, or is the identity the ipcache gives the inner source).
type Identities struct{ m *ebpf.Map }

// Map returns the underlying map.
func (s *Identities) Map() *ebpf.Map { return s.m }

// Add puts id into the set.
func (s *Identities) Add(id identity.NumericIdentity) error {
	k, v := uint32(id), uint32(1)
	if err := s.m.Update(&k, &v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("add identity %d to %s: %w", id, mapName(s.m), err)
	}
	return nil
}

// Remove takes id out of the set; a missing id is not an error.
func (s *Identities) Remove(id identity.NumericIdentity) error {
	k := uint32(id)
	if err := s.m.Delete(&k); err != nil && !isNotExist(err) {
		return fmt.Errorf("remove identity %d from %s: %w", id, mapName(s.m), err)
	}
	return nil
}

// Has reports whether id is in the set.
func (s *Identities) Has(id identity.NumericIdentity) (bool, error) {
	k := uint32(id)
	var v uint32
	err := s.m.Lookup(&k, &v)
	if isNotExist(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("look up identity %d in %s: %w", id, mapName(s.m), err)
	}
	return true, nil
}

// All returns every identity in the set.
func (s *Identities) All() ([]identity.NumericIdentity, error) {
	var out []identity.NumericIdentity
	err := iterate(s.m, func(k *uint32, _ *uint32) bool {
		out = append(out, identity.NumericIdentity(*k))
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", mapName(s.m), err)
	}
	return out, nil
}

// Sync makes the set exactly want: missing identities are added, others
// removed. It returns how many it added and removed.
func (s *Identities) Sync(want map[identity.NumericIdentity]bool) (added, removed int, err error) {
	have, err := s.All()
	if err != nil {
		return 0, 0, err
	}
	present := map[identity.NumericIdentity]bool{}
	for _, id := range have {
		if !want[id] {
			if err := s.Remove(id); err != nil {
				return added, removed, err
			}
			removed++
			continue
		}
		present[id] = true
	}
	for id := range want {
		if present[id] {
			continue
		}
		if err := s.Add(id); err != nil {
			return added, removed, err
		}
		added++
	}
	return added, removed, nil
}
