// Package endpoints defines the endpoints table: one row per local
// endpoint (a pod's interface, or the node's health endpoint), written only
// by the endpoint manager and read by the CEP synchronizer, the API, the
// CLI and later the datapath. It also builds the endpoint's status in the
// CiliumEndpoint format, so that the API and the CEP print the same thing.
package endpoints

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/labels"
)

// TableName is the endpoints table's name.
const TableName = "endpoints"

// MaxLogEntries bounds the state-change log kept in an endpoint.
const MaxLogEntries = 8

// Endpoint is one local endpoint. Rows are immutable: copy, then insert.
type Endpoint struct {
	// ID is unique on this node, 1..4095.
	ID uint16 `json:"id"`
	// ContainerID and ContainerIfName identify the CNI attachment.
	ContainerID     string `json:"container-id,omitempty"`
	ContainerIfName string `json:"container-interface-name,omitempty"`
	// PodNamespace, PodName and PodUID identify the pod (empty for the
	// health endpoint).
	PodNamespace string `json:"pod-namespace,omitempty"`
	PodName      string `json:"pod-name,omitempty"`
	PodUID       string `json:"pod-uid,omitempty"`
	// CEPNamespace and CEPName name the CiliumEndpoint of this endpoint.
	CEPNamespace string `json:"cep-namespace"`
	CEPName      string `json:"cep-name"`
	// HostIfName, HostIfIndex and the MACs describe the veth.
	HostIfName  string `json:"interface-name,omitempty"`
	HostIfIndex int    `json:"interface-index,omitempty"`
	MAC         string `json:"mac,omitempty"`
	HostMAC     string `json:"host-mac,omitempty"`
	NetnsPath   string `json:"netns-path,omitempty"`
	// IPv4 is the endpoint's address.
	IPv4 netip.Addr `json:"ipv4"`
	// Labels are the security-relevant labels; InfoLabels the others.
	Labels     labels.Labels `json:"labels"`
	InfoLabels labels.Labels `json:"info-labels"`
	// Identity is the numeric security identity (0 until resolved).
	Identity identity.NumericIdentity `json:"identity"`
	// State is the lifecycle state (the CRD's values). Once the identity
	// is resolved, the endpoint manager derives it from the endpoint's
	// policy (see PolicyRevision): waiting-to-regenerate while its policy
	// is out of date, regenerating while it takes a newly computed policy,
	// ready once it has.
	State ciliumv2.EndpointState `json:"state"`
	// PolicyRevision is the policy repository revision of the policy the
	// endpoint has taken (its last regeneration); 0 before the first. It
	// is Cilium's endpoint policy-revision. The CEP has no field for it.
	PolicyRevision uint64 `json:"policy-revision,omitempty"`
	// IdentityPending is set while the identity of changed labels is
	// being allocated: the state stays waiting-to-regenerate until then,
	// whatever the policy of the old identity says.
	IdentityPending bool `json:"identity-pending,omitempty"`
	// PolicyRestored marks an endpoint restored after an agent restart
	// whose policy has not been computed by this run yet: its datapath
	// still holds what the previous run realized, so it counts as ready
	// meanwhile (an agent that boots without the API server cannot compute
	// policies). Cleared at its first regeneration.
	PolicyRestored bool `json:"policy-restored,omitempty"`
	// NamedPorts are the pod's named container ports.
	NamedPorts ciliumv2.NamedPorts `json:"named-ports,omitempty"`
	// ServiceAccount is the pod's service account.
	ServiceAccount string `json:"service-account,omitempty"`
	// Health marks the node's health endpoint.
	Health bool `json:"health,omitempty"`
	// Log holds the last state changes, newest last.
	Log []*ciliumv2.EndpointStatusChange `json:"log,omitempty"`
	// Created is when the endpoint was created.
	Created time.Time `json:"created"`
}

// PodKey is "namespace/name" of the pod, or "" for non-pod endpoints.
func (e *Endpoint) PodKey() string {
	if e.PodName == "" {
		return ""
	}
	return e.PodNamespace + "/" + e.PodName
}

// CEPKey is "namespace/name" of the endpoint's CiliumEndpoint.
func (e *Endpoint) CEPKey() string { return e.CEPNamespace + "/" + e.CEPName }

// Clone returns a shallow copy whose log can be appended to.
func (e *Endpoint) Clone() *Endpoint {
	c := *e
	c.Log = slices.Clone(e.Log)
	return &c
}

// WithState returns a copy in state s, with the change logged.
func (e *Endpoint) WithState(s ciliumv2.EndpointState, msg string, now time.Time) *Endpoint {
	c := e.Clone()
	if c.State == s {
		return c
	}
	c.State = s
	c.Log = append(c.Log, &ciliumv2.EndpointStatusChange{
		Code: LogCodeOK, Message: msg, State: string(s), Timestamp: now.UTC().Format(time.RFC3339),
	})
	if len(c.Log) > MaxLogEntries {
		c.Log = c.Log[len(c.Log)-MaxLogEntries:]
	}
	return c
}

// InService reports whether the endpoint has its identity and serves
// traffic: ready, regenerating its policy (waiting-to-regenerate,
// regenerating), or not-ready (the datapath refused its policy and drops
// its traffic until it takes one).
func (e *Endpoint) InService() bool {
	switch e.State {
	case ciliumv2.EndpointStateReady, ciliumv2.EndpointStateWaitingToRegenerate, ciliumv2.EndpointStateRegenerating,
		ciliumv2.EndpointStateNotReady:
		return true
	}
	return false
}

// Codes of the state-change log entries (Cilium's values).
const (
	LogCodeOK     = "ok"
	LogCodeFailed = "failed"
)

// WithFailure returns a copy, in the same state, whose log ends with a
// failed entry saying msg. A repeat of the last failure is not logged
// again (the returned copy is then equal to e).
func (e *Endpoint) WithFailure(msg string, now time.Time) *Endpoint {
	c := e.Clone()
	if n := len(c.Log); n > 0 && c.Log[n-1].Code == LogCodeFailed && c.Log[n-1].Message == msg && c.Log[n-1].State == string(c.State) {
		return c
	}
	c.Log = append(c.Log, &ciliumv2.EndpointStatusChange{
		Code: LogCodeFailed, Message: msg, State: string(c.State), Timestamp: now.UTC().Format(time.RFC3339),
	})
	if len(c.Log) > MaxLogEntries {
		c.Log = c.Log[len(c.Log)-MaxLogEntries:]
	}
	return c
}

// Failure is the message of the last failure when the endpoint is stuck:
// not ready, not being deleted, and its log ends with a failed entry. ""
// otherwise.
func (e *Endpoint) Failure() string {
	switch e.State {
	case ciliumv2.EndpointStateReady, ciliumv2.EndpointStateDisconnecting, ciliumv2.EndpointStateDisconnected:
		return ""
	}
	if n := len(e.Log); n > 0 && e.Log[n-1].Code == LogCodeFailed {
		return e.Log[n-1].Message
	}
	return ""
}

// TableHeader implements statedb.TableWritable.
func (e *Endpoint) TableHeader() []string {
	return []string{"ID", "Pod", "ContainerID", "IPv4", "Identity", "State", "PolicyRevision"}
}

// TableRow implements statedb.TableWritable.
func (e *Endpoint) TableRow() []string {
	return []string{strconv.Itoa(int(e.ID)), e.PodKey(), shortID(e.ContainerID), e.IPv4.String(),
		strconv.Itoa(int(e.Identity)), string(e.State), strconv.FormatUint(e.PolicyRevision, 10)}
}

func shortID(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}

// Status builds the endpoint's status exactly as the CiliumEndpoint
// carries it. nodeIP is this node's IP (networking.node).
func (e *Endpoint) Status(nodeIP string) ciliumv2.EndpointStatus {
	st := ciliumv2.EndpointStatus{
		ID:             int64(e.ID),
		State:          e.State,
		ServiceAccount: e.ServiceAccount,
		NamedPorts:     e.NamedPorts,
		Log:            e.Log,
		Networking:     &ciliumv2.EndpointNetworking{NodeIP: nodeIP, Addressing: ciliumv2.AddressPairList{}},
		Health: &ciliumv2.EndpointHealth{
			// No BPF programs or policy yet: the control plane is all
			// there is, and it is healthy once the endpoint is ready.
			Bpf: ciliumv2.EndpointHealthDisabled, Policy: ciliumv2.EndpointHealthDisabled,
			OverallHealth: overall(e.State), Connected: e.State == ciliumv2.EndpointStateReady,
		},
	}
	if e.Failure() != "" {
		// Stuck: the last log entry says why; the agent retries.
		st.Health.OverallHealth = ciliumv2.EndpointHealthFailure
	}
	if e.IPv4.IsValid() {
		st.Networking.Addressing = append(st.Networking.Addressing, &ciliumv2.AddressPair{IPV4: e.IPv4.String()})
	}
	if e.ContainerID != "" || e.PodName != "" {
		st.ExternalIdentifiers = &ciliumv2.EndpointIdentifiers{
			ContainerID: e.ContainerID,
			PodName:     e.PodKey(),
		}
		if e.ContainerID != "" {
			st.ExternalIdentifiers.CNIAttachmentID = e.ContainerID + ":" + e.ContainerIfName
		}
	}
	if e.Identity != identity.InvalidIdentity {
		st.Identity = &ciliumv2.EndpointIdentity{ID: int64(e.Identity), Labels: e.Labels.Strings()}
		slices.Sort(st.Identity.Labels)
	}
	return st
}

func overall(s ciliumv2.EndpointState) ciliumv2.EndpointHealthStatus {
	switch s {
	case ciliumv2.EndpointStateReady:
		return ciliumv2.EndpointHealthOK
	case ciliumv2.EndpointStateInvalid, ciliumv2.EndpointStateDisconnected, ciliumv2.EndpointStateNotReady:
		return ciliumv2.EndpointHealthFailure
	}
	return ciliumv2.EndpointHealthPending
}

// Indexes of the endpoints table.
var (
	// IDIndex is the primary index: the endpoint ID.
	IDIndex = statedb.Index[*Endpoint, uint16]{
		Name:       "id",
		FromObject: func(e *Endpoint) index.KeySet { return index.NewKeySet(index.Uint16(e.ID)) },
		FromKey:    index.Uint16,
		FromString: index.Uint16String,
		Unique:     true,
	}
	// ContainerIndex finds an endpoint by container ID.
	ContainerIndex = statedb.Index[*Endpoint, string]{
		Name: "container",
		FromObject: func(e *Endpoint) index.KeySet {
			if e.ContainerID == "" {
				return index.KeySet{}
			}
			return index.NewKeySet(index.String(e.ContainerID))
		},
		FromKey:    index.String,
		FromString: index.FromString,
		Unique:     true,
	}
	// PodIndex finds endpoints by pod "namespace/name".
	PodIndex = statedb.Index[*Endpoint, string]{
		Name: "pod",
		FromObject: func(e *Endpoint) index.KeySet {
			if e.PodName == "" {
				return index.KeySet{}
			}
			return index.NewKeySet(index.String(e.PodKey()))
		},
		FromKey:    index.String,
		FromString: index.FromString,
	}
	// CEPIndex finds the endpoint of a CiliumEndpoint "namespace/name".
	CEPIndex = statedb.Index[*Endpoint, string]{
		Name:       "cep",
		FromObject: func(e *Endpoint) index.KeySet { return index.NewKeySet(index.String(e.CEPKey())) },
		FromKey:    index.String,
		FromString: index.FromString,
	}
	// IPIndex finds an endpoint by IPv4 address.
	IPIndex = statedb.Index[*Endpoint, netip.Addr]{
		Name: "ip",
		FromObject: func(e *Endpoint) index.KeySet {
			if !e.IPv4.IsValid() {
				return index.KeySet{}
			}
			return index.NewKeySet(index.NetIPAddr(e.IPv4))
		},
		FromKey: index.NetIPAddr,
		Unique:  true,
	}
)

// NewTable creates the endpoints table.
func NewTable(db *statedb.DB) (statedb.RWTable[*Endpoint], error) {
	return statedb.NewTable(db, TableName, IDIndex, ContainerIndex, PodIndex, CEPIndex, IPIndex)
}

// LabelsString is the labels joined for display.
func LabelsString(l labels.Labels) string { return strings.Join(l.Strings(), " ") }
