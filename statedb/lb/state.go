package lb

import (
	"fmt"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
)

// ServiceStatesTableName is the table of Services (and pods' hostPorts)
// the load balancer could not serve as asked (`cellium statedb
// lb-service-states`, `cellium service list`).
const ServiceStatesTableName = "lb-service-states"

// Service states (ServiceState.State).
const (
	// StateRefused: none of the Service's frontends is in the maps (it
	// does not fit them, or one of its frontends belongs to another
	// Service or pod); the frontends it had before are removed.
	StateRefused = "Refused"
	// StateDegraded: the Service is served, but some of its endpoints
	// were skipped (a malformed EndpointSlice), or a socket of the node
	// listens on one of its NodePorts (hostPorts) and gets none of the
	// traffic from outside.
	StateDegraded = "Degraded"
)

// Reasons (ServiceState.Reason, the Event's reason).
const (
	// ReasonLBMapFull: the Service's frontends and backends do not fit in
	// the load balancer maps (--bpf-lb-map-max).
	ReasonLBMapFull = "LBMapFull"
	// ReasonFrontendConflict: a frontend of the Service (or pod's
	// hostPort) is owned by another Service or pod.
	ReasonFrontendConflict = "FrontendConflict"
	// ReasonInvalidEndpoints: endpoints of the Service's EndpointSlices
	// were skipped.
	ReasonInvalidEndpoints = "InvalidEndpoints"
	// ReasonHostPortInUse: a socket in the node's host network namespace
	// (not the agent's) listens on a NodePort of the Service (or a
	// hostPort of the pod) on every address or on the frontend's: the
	// load balancer takes the port's traffic from outside the node, the
	// socket gets none of it.
	ReasonHostPortInUse = "HostPortInUse"
)

// HostSocketSuffix ends the owner of the rows about host sockets on a
// Service's NodePorts or a pod's hostPorts (ReasonHostPortInUse):
// "ns/name/host-socket", "ns/name/host-port/host-socket". The load
// balancer's deriver writes the rows of the plain owners, the host-port
// checker (datapath/hostportcheck) those with the suffix; a Service can
// have one of each.
const HostSocketSuffix = "/host-socket"

// HostSocketOwner is the owner of the host-socket row of owner (a
// Service's "ns/name" or a pod's HostPortOwner).
func HostSocketOwner(owner string) string { return owner + HostSocketSuffix }

// ServiceState is why a Service (or a pod's hostPorts) is not served as
// its objects ask. A Service served as asked has no row. Rows are
// immutable.
type ServiceState struct {
	// Owner is the Service's "namespace/name", or for a pod's hostPorts
	// HostPortOwner of the pod ("namespace/name/host-port"); either with
	// HostSocketSuffix for the row about host sockets on its ports.
	Owner string `json:"owner"`
	// State is StateRefused or StateDegraded.
	State string `json:"state"`
	// Reason is one of the Reason constants (the Event's reason).
	Reason string `json:"reason"`
	// Message says what is wrong and what to do, for people.
	Message string `json:"message"`
}

// IsPod reports whether the row is about a pod's hostPorts.
func (s *ServiceState) IsPod() bool {
	_, ok := hostPortPod(s.Owner)
	return ok
}

// Object returns the namespace and name of the Service or pod the row is
// about.
func (s *ServiceState) Object() (ns, name string) {
	key := strings.TrimSuffix(s.Owner, HostSocketSuffix)
	if pod, ok := hostPortPod(key); ok {
		key = pod
	}
	for i := 0; i < len(key); i++ {
		if key[i] == '/' {
			return key[:i], key[i+1:]
		}
	}
	return "", key
}

func hostPortPod(owner string) (string, bool) {
	owner = strings.TrimSuffix(owner, HostSocketSuffix)
	if len(owner) > len(HostPortSuffix) && owner[len(owner)-len(HostPortSuffix):] == HostPortSuffix {
		return owner[:len(owner)-len(HostPortSuffix)], true
	}
	return "", false
}

// TableHeader implements statedb.TableWritable.
func (*ServiceState) TableHeader() []string { return []string{"Owner", "State", "Reason", "Message"} }

// TableRow implements statedb.TableWritable.
func (s *ServiceState) TableRow() []string { return []string{s.Owner, s.State, s.Reason, s.Message} }

// ServiceStateOwnerIndex is the service states table's primary index.
var ServiceStateOwnerIndex = statedb.Index[*ServiceState, string]{
	Name:       "owner",
	FromObject: func(s *ServiceState) index.KeySet { return index.NewKeySet(index.String(s.Owner)) },
	FromKey:    index.String,
	FromString: index.FromString,
	Unique:     true,
}

// NewServiceStatesTable creates and registers the service states table.
func NewServiceStatesTable(db *statedb.DB) (statedb.RWTable[*ServiceState], error) {
	t, err := statedb.NewTable(db, ServiceStatesTableName, ServiceStateOwnerIndex)
	if err != nil {
		return nil, fmt.Errorf("create table %s: %w", ServiceStatesTableName, err)
	}
	return t, nil
}
