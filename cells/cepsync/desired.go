package cepsync

import (
	"strconv"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/equality"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/statedb/reconciler"
)

// Config is the synchronizer's configuration.
type Config struct {
	// DisableEndpointCRD stops the agent from writing CiliumEndpoints
	// (Cilium's flag).
	DisableEndpointCRD bool
}

// DefaultConfig writes CEPs.
var DefaultConfig = Config{}

// Flags registers --disable-endpoint-crd.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.Bool("disable-endpoint-crd", def.DisableEndpointCRD, "Do not create or update CiliumEndpoint objects")
}

// DesiredCEP is what one CiliumEndpoint should be.
type DesiredCEP struct {
	Namespace, Name string
	// EndpointID is the local endpoint it mirrors.
	EndpointID uint16
	// PodName and PodUID are the owner (empty for the health endpoint).
	PodName, PodUID string
	// Labels are copied from the pod.
	Labels map[string]string
	// Status is the CEP's .status.
	Status ciliumv2.EndpointStatus
	// Health marks the node's health endpoint's CEP.
	Health bool
	// Reconcile is the reconciler's status for this row.
	Reconcile reconciler.Status
}

// Key is "namespace/name".
func (d *DesiredCEP) Key() string { return d.Namespace + "/" + d.Name }

// sameAs is true when d and o would produce the same object.
func (d *DesiredCEP) sameAs(o *DesiredCEP) bool {
	return d.Namespace == o.Namespace && d.Name == o.Name && d.EndpointID == o.EndpointID &&
		d.PodName == o.PodName && d.PodUID == o.PodUID && d.Health == o.Health &&
		equality.Semantic.DeepEqual(d.Labels, o.Labels) && equality.Semantic.DeepEqual(d.Status, o.Status)
}

// TableHeader implements statedb.TableWritable.
func (d *DesiredCEP) TableHeader() []string {
	return []string{"CEP", "Endpoint", "State", "Reconcile"}
}

// TableRow implements statedb.TableWritable.
func (d *DesiredCEP) TableRow() []string {
	return []string{d.Key(), strconv.Itoa(int(d.EndpointID)), string(d.Status.State), d.Reconcile.String()}
}

// DesiredKeyIndex is the primary index: "namespace/name".
var DesiredKeyIndex = statedb.Index[*DesiredCEP, string]{
	Name:       "key",
	FromObject: func(d *DesiredCEP) index.KeySet { return index.NewKeySet(index.String(d.Key())) },
	FromKey:    index.String,
	FromString: index.FromString,
	Unique:     true,
}

// DesiredTableName is the desired CEPs table's name.
const DesiredTableName = "cilium-endpoints-desired"

// NewDesiredTable creates the desired CEPs table.
func NewDesiredTable(db *statedb.DB) (statedb.RWTable[*DesiredCEP], error) {
	return statedb.NewTable(db, DesiredTableName, DesiredKeyIndex)
}
