package maps

import (
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/statedb/identity"
)

// EndpointInfo is the value of a local endpoint's address.
type EndpointInfo struct {
	// IfIndex is the ifindex of the host-side veth.
	IfIndex uint32
	// ID is the endpoint ID (lxc_id).
	ID uint16
	// Flags are reserved (0).
	Flags uint16
	// MAC is the pod-side MAC, NodeMAC the host-side one.
	MAC     net.HardwareAddr
	NodeMAC net.HardwareAddr
	// Identity is the endpoint's security identity.
	Identity identity.NumericIdentity
}

// Endpoints is cellium_lxc: local endpoint address -> endpoint.
type Endpoints struct{ m *ebpf.Map }

// Map returns the underlying map.
func (e *Endpoints) Map() *ebpf.Map { return e.m }

// EndpointKey encodes a as the BPF key.
func EndpointKey(a netip.Addr) (bpf.LxcEndpointKey, error) {
	w, fam, err := addrWords(a)
	if err != nil {
		return bpf.LxcEndpointKey{}, err
	}
	return bpf.LxcEndpointKey{Ip: w, Family: fam}, nil
}

func endpointValue(info EndpointInfo) (bpf.LxcEndpointInfo, error) {
	mac, err := macBytes(info.MAC)
	if err != nil {
		return bpf.LxcEndpointInfo{}, err
	}
	nodeMAC, err := macBytes(info.NodeMAC)
	if err != nil {
		return bpf.LxcEndpointInfo{}, err
	}
	return bpf.LxcEndpointInfo{
		Ifindex: info.IfIndex, LxcId: info.ID, Flags: info.Flags,
		Mac: mac, NodeMac: nodeMAC, SecIdentity: uint32(info.Identity),
	}, nil
}

func endpointInfo(v *bpf.LxcEndpointInfo) EndpointInfo {
	return EndpointInfo{
		IfIndex: v.Ifindex, ID: v.LxcId, Flags: v.Flags,
		MAC: slices.Clone(net.HardwareAddr(v.Mac[:])), NodeMAC: slices.Clone(net.HardwareAddr(v.NodeMac[:])),
		Identity: identity.NumericIdentity(v.SecIdentity),
	}
}

// Update sets the endpoint of address a.
func (e *Endpoints) Update(a netip.Addr, info EndpointInfo) error {
	k, err := EndpointKey(a)
	if err != nil {
		return err
	}
	v, err := endpointValue(info)
	if err != nil {
		return fmt.Errorf("endpoint %v: %w", a, err)
	}
	if err := e.m.Update(&k, &v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("update endpoints %v: %w", a, err)
	}
	return nil
}

// BatchUpdate sets many endpoints at once; addrs and infos pair up by
// index.
func (e *Endpoints) BatchUpdate(addrs []netip.Addr, infos []EndpointInfo) error {
	if len(addrs) != len(infos) {
		return fmt.Errorf("endpoints batch: %d addresses but %d infos", len(addrs), len(infos))
	}
	keys := make([]bpf.LxcEndpointKey, len(addrs))
	vals := make([]bpf.LxcEndpointInfo, len(addrs))
	for i := range addrs {
		var err error
		if keys[i], err = EndpointKey(addrs[i]); err != nil {
			return err
		}
		if vals[i], err = endpointValue(infos[i]); err != nil {
			return fmt.Errorf("endpoint %v: %w", addrs[i], err)
		}
	}
	return batchUpdate(e.m, keys, vals)
}

// Delete removes address a; a missing address is not an error.
func (e *Endpoints) Delete(a netip.Addr) error {
	k, err := EndpointKey(a)
	if err != nil {
		return err
	}
	return deleteKey(e.m, &k)
}

// Lookup returns the endpoint of address a, or an error wrapping
// ebpf.ErrKeyNotExist.
func (e *Endpoints) Lookup(a netip.Addr) (EndpointInfo, error) {
	k, err := EndpointKey(a)
	if err != nil {
		return EndpointInfo{}, err
	}
	var v bpf.LxcEndpointInfo
	if err := e.m.Lookup(&k, &v); err != nil {
		return EndpointInfo{}, fmt.Errorf("look up endpoint %v: %w", a, err)
	}
	return endpointInfo(&v), nil
}

// Iterate calls yield for every endpoint until it returns false.
func (e *Endpoints) Iterate(yield func(netip.Addr, EndpointInfo) bool) error {
	var derr error
	err := iterate(e.m, func(k *bpf.LxcEndpointKey, v *bpf.LxcEndpointInfo) bool {
		a, err := wordsAddr(k.Ip, k.Family)
		if err != nil {
			derr = err
			return false
		}
		return yield(a, endpointInfo(v))
	})
	if err != nil {
		return err
	}
	return derr
}
