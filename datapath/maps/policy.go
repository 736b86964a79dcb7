package maps

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/policy"
)

// PolicyMapPrefix starts the pin name of every endpoint's policy map.
const PolicyMapPrefix = "cellium_policy_"

// policyStaticPrefix is the part of a policy key's prefix length taken by
// the identity and the direction byte (statedb/policy's static bits).
const policyStaticPrefix = 40

// PolicyMapPinName returns the pin name of endpoint epID's policy map,
// cellium_policy_%05d.
func PolicyMapPinName(epID uint16) string {
	return fmt.Sprintf("%s%05d", PolicyMapPrefix, epID)
}

// PolicyMap is an endpoint's cellium_policy_%05d map: statedb/policy keys
// to allow or deny. The programs decide with it exactly as
// policy.DirectionPolicy.Decide does with the same entries.
type PolicyMap struct {
	m    *ebpf.Map
	path string
}

// OpenPolicyMap opens endpoint epID's policy map pinned in dir, creating
// and pinning it if missing. Concurrent openers of the same map all get
// the one pinned map. Close it when done; the pin stays until
// RemovePolicyMap.
func OpenPolicyMap(dir string, epID uint16) (*PolicyMap, error) {
	spec, err := bpf.LoadLxc()
	if err != nil {
		return nil, fmt.Errorf("load embedded BPF object: %w", err)
	}
	tmpl, ok := spec.Maps[PolicyMapName]
	if !ok {
		return nil, fmt.Errorf("embedded BPF object has no map %s", PolicyMapName)
	}
	ms := tmpl.Copy()
	// The kernel keeps 15 characters of a map name; the pin has the ID.
	ms.Name = PolicyMapPinName(epID)
	ms.Pinning = ebpf.PinByName
	m, err := ebpf.NewMapWithOptions(ms, ebpf.MapOptions{PinPath: dir})
	if errors.Is(err, os.ErrExist) {
		// Another opener (the loader and the policy map reconciler both
		// open a new endpoint's map) pinned it between our lookup and our
		// pin: the pin is there now, so this opens it.
		m, err = ebpf.NewMapWithOptions(ms, ebpf.MapOptions{PinPath: dir})
	}
	if err != nil {
		return nil, fmt.Errorf("open policy map of endpoint %d in %s: %w", epID, dir, err)
	}
	return &PolicyMap{m: m, path: filepath.Join(dir, ms.Name)}, nil
}

// LoadPinnedPolicyMap opens endpoint epID's policy map pinned in dir
// read-only, without ever creating it: for readers (tests, diagnostics)
// that must not pin a map of an endpoint that is gone. A missing pin is
// an error wrapping os.ErrNotExist.
func LoadPinnedPolicyMap(dir string, epID uint16) (*PolicyMap, error) {
	path := filepath.Join(dir, PolicyMapPinName(epID))
	m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("load the pinned policy map of endpoint %d (%s): %w", epID, path, err)
	}
	return &PolicyMap{m: m, path: path}, nil
}

// RemovePolicyMap removes the pin of endpoint epID's policy map; a missing
// pin is not an error. Programs still attached keep the map until they go.
func RemovePolicyMap(dir string, epID uint16) error {
	err := os.Remove(filepath.Join(dir, PolicyMapPinName(epID)))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove policy map of endpoint %d: %w", epID, err)
	}
	return nil
}

// Map returns the underlying map (for MapReplacements).
func (p *PolicyMap) Map() *ebpf.Map { return p.m }

// Path returns the pin path.
func (p *PolicyMap) Path() string { return p.path }

// Close closes the file descriptor; the pin stays.
func (p *PolicyMap) Close() error { return p.m.Close() }

// PolicyKey encodes k as the BPF key: prefixlen = k.PrefixLen(), the port
// in network byte order.
func PolicyKey(k policy.Key) bpf.LxcPolicyKey {
	k = policy.NewKey(k.Identity, k.Direction, k.Proto, k.Port, k.PortPrefixLen)
	return bpf.LxcPolicyKey{
		Prefixlen: k.PrefixLen(),
		SecLabel:  uint32(k.Identity),
		Egress:    uint8(k.Direction),
		Protocol:  k.Proto,
		Dport:     htons(k.Port),
	}
}

// PolicyKeyFrom decodes a BPF key. A prefix length outside 40..64, or
// between 41 and 47 (part of the protocol), is ErrInvalidKey.
func PolicyKeyFrom(b bpf.LxcPolicyKey) (policy.Key, error) {
	if b.Prefixlen < policyStaticPrefix || b.Prefixlen > policyStaticPrefix+24 ||
		(b.Prefixlen > policyStaticPrefix && b.Prefixlen < policyStaticPrefix+8) {
		return policy.Key{}, fmt.Errorf("%w: policy prefix length %d", ErrInvalidKey, b.Prefixlen)
	}
	if b.Egress > 1 {
		return policy.Key{}, fmt.Errorf("%w: policy direction %d", ErrInvalidKey, b.Egress)
	}
	lpm := b.Prefixlen - policyStaticPrefix
	proto, portLen := b.Protocol, uint8(0)
	if lpm == 0 {
		proto = policy.ProtoAny
	} else {
		portLen = uint8(lpm - 8)
	}
	return policy.NewKey(identity.NumericIdentity(b.SecLabel), policy.Direction(b.Egress), proto, ntohs(b.Dport), portLen), nil
}

// policyValue is the BPF value of an entry.
func policyValue(e policy.Entry) bpf.LxcPolicyEntry {
	v := bpf.LxcPolicyEntry{LpmPrefixLength: e.LPMPrefixLen()}
	if e.Deny {
		v.Deny = 1
	}
	return v
}

// Update sets entry e (its key and whether it denies; DerivedFrom is not
// stored).
func (p *PolicyMap) Update(e policy.Entry) error {
	k, v := PolicyKey(e.Key), policyValue(e)
	if err := p.m.Update(&k, &v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("update policy %s: %w", e.Key, err)
	}
	return nil
}

// BatchUpdate sets many entries at once.
func (p *PolicyMap) BatchUpdate(entries []policy.Entry) error {
	keys := make([]bpf.LxcPolicyKey, len(entries))
	vals := make([]bpf.LxcPolicyEntry, len(entries))
	for i, e := range entries {
		keys[i], vals[i] = PolicyKey(e.Key), policyValue(e)
	}
	return batchUpdate(p.m, keys, vals)
}

// Delete removes key k; a missing key is not an error.
func (p *PolicyMap) Delete(k policy.Key) error {
	bk := PolicyKey(k)
	return deleteKey(p.m, &bk)
}

// PolicyValue is what a policy map lookup finds.
type PolicyValue struct {
	Deny bool
	// LPMPrefixLen is the protocol/port prefix length of the entry that
	// matched (policy.Key.LPMPrefixLen), telling which one it was.
	LPMPrefixLen uint8
}

// Lookup returns the longest entry matching k's identity, direction,
// protocol and port (an LPM trie lookup, as the datapath does it), or an
// error wrapping ebpf.ErrKeyNotExist when none does. Iterate for exact
// entries.
func (p *PolicyMap) Lookup(k policy.Key) (PolicyValue, error) {
	bk := PolicyKey(k)
	var v bpf.LxcPolicyEntry
	if err := p.m.Lookup(&bk, &v); err != nil {
		return PolicyValue{}, fmt.Errorf("look up policy %s: %w", k, err)
	}
	return PolicyValue{Deny: v.Deny != 0, LPMPrefixLen: v.LpmPrefixLength}, nil
}

// Iterate calls yield for every entry until it returns false.
func (p *PolicyMap) Iterate(yield func(policy.Entry) bool) error {
	var derr error
	err := iterate(p.m, func(k *bpf.LxcPolicyKey, v *bpf.LxcPolicyEntry) bool {
		key, err := PolicyKeyFrom(*k)
		if err != nil {
			derr = err
			return false
		}
		return yield(policy.Entry{Key: key, Deny: v.Deny != 0})
	})
	if err != nil {
		return err
	}
	return derr
}
