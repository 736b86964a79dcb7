package kvstore

import (
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/cellium/cellium/statedb/identity"
)

// NodeJSON is Cilium's pkg/node/types.Node as it appears in etcd: no JSON
// tags, so the keys are the Go field names.
type NodeJSON struct {
	Name                    string
	Cluster                 string
	IPAddresses             []NodeAddressJSON
	IPv4AllocCIDR           *CIDRJSON
	IPv4SecondaryAllocCIDRs []*CIDRJSON
	IPv6AllocCIDR           *CIDRJSON
	IPv6SecondaryAllocCIDRs []*CIDRJSON
	IPv4HealthIP            net.IP
	IPv6HealthIP            net.IP
	IPv4IngressIP           net.IP
	IPv6IngressIP           net.IP
	ClusterID               uint32
	Source                  string
	EncryptionKey           uint8
	Labels                  map[string]string
	Annotations             map[string]string
	WireguardPubKey         string
	BootID                  string
}

// NodeAddressJSON is Cilium's node Address.
type NodeAddressJSON struct {
	Type string
	IP   net.IP
}

// CIDRJSON is Cilium's cidr.CIDR (an embedded *net.IPNet) in JSON.
type CIDRJSON struct {
	IP   net.IP
	Mask net.IPMask
}

// IPIdentitiesPrefix is the root of the ipcache keys (Cilium's
// ipcache.IPIdentitiesPath), and IPAddressSpace the one address space
// Cilium writes under it (ipcache.DefaultAddressSpace).
const (
	IPIdentitiesPrefix = StatePrefix + "/ip/v1"
	IPAddressSpace     = "default"
	// IPKeysPrefix + <IP> is an ipcache key; its value is IPIdentityPair
	// JSON; leased.
	IPKeysPrefix = IPIdentitiesPrefix + "/" + IPAddressSpace + "/"
)

// IPKey is the ipcache key of the address ip.
func IPKey(ip netip.Addr) string { return IPKeysPrefix + ip.String() }

// IPIdentityPair is Cilium's identity.IPIdentityPair, the value of an
// ipcache key, with its JSON names.
type IPIdentityPair struct {
	IP                net.IP                   `json:"IP"`
	Mask              net.IPMask               `json:"Mask"`
	HostIP            net.IP                   `json:"HostIP"`
	ID                identity.NumericIdentity `json:"ID"`
	Key               uint8                    `json:"Key"`
	Metadata          string                   `json:"Metadata"`
	K8sNamespace      string                   `json:"K8sNamespace,omitempty"`
	K8sPodName        string                   `json:"K8sPodName,omitempty"`
	K8sServiceAccount string                   `json:"K8sServiceAccount,omitempty"`
	NamedPorts        []NamedPortJSON          `json:"NamedPorts,omitempty"`
}

// NamedPortJSON is Cilium's identity.NamedPort.
type NamedPortJSON struct {
	Name     string `json:"Name"`
	Port     uint16 `json:"Port"`
	Protocol string `json:"Protocol"`
}

// EndpointMetadata is the Metadata Cilium writes for an endpoint:
// "cilium-global:default:<node>:<endpoint ID>".
func EndpointMetadata(node string, id uint16) string {
	return NodeMetadataPrefix(node) + strconv.Itoa(int(id))
}

// NodeMetadataPrefix is what every EndpointMetadata of node starts with:
// "cilium-global:default:<node>:".
func NodeMetadataPrefix(node string) string {
	return strings.Join([]string{"cilium-global", IPAddressSpace, node, ""}, ":")
}
