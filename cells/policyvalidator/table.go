package policyvalidator

import (
	"fmt"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	corev1 "k8s.io/api/core/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/statedb/reconciler"
)

// TableName is the desired conditions table's name.
const TableName = "policy-conditions"

// Kinds of the objects a row is about.
const (
	KindCNP  = "CiliumNetworkPolicy"
	KindCCNP = "CiliumClusterwideNetworkPolicy"
)

// PolicyConditions is the conditions one policy's status should carry
// (without transition times), and their reconciliation status. Rows are
// immutable.
type PolicyConditions struct {
	// Kind is KindCNP or KindCCNP.
	Kind string `json:"kind"`
	// Namespace (empty for a CCNP), Name and UID name the object.
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
	// Conditions are the conditions to set; others are left alone.
	Conditions []ciliumv2.NetworkPolicyCondition `json:"conditions"`
	// Reconcile is the reconciler's status of this row.
	Reconcile reconciler.Status `json:"reconcile"`
}

// Key is "Kind/namespace/name" (or "Kind/name").
func (p *PolicyConditions) Key() string {
	if p.Namespace == "" {
		return p.Kind + "/" + p.Name
	}
	return p.Kind + "/" + p.Namespace + "/" + p.Name
}

// sameAs reports whether o asks for the same conditions of the same object.
func (p *PolicyConditions) sameAs(o *PolicyConditions) bool {
	if p.Key() != o.Key() || p.UID != o.UID || len(p.Conditions) != len(o.Conditions) {
		return false
	}
	for i := range p.Conditions {
		a, b := p.Conditions[i], o.Conditions[i]
		if a.Type != b.Type || a.Status != b.Status || a.Reason != b.Reason || a.Message != b.Message {
			return false
		}
	}
	return true
}

// TableHeader implements statedb.TableWritable.
func (p *PolicyConditions) TableHeader() []string {
	return []string{"Policy", "Conditions", "Status"}
}

// TableRow implements statedb.TableWritable.
func (p *PolicyConditions) TableRow() []string {
	var cs []string
	for _, c := range p.Conditions {
		s := string(c.Type) + "=" + string(c.Status)
		if c.Status == corev1.ConditionFalse {
			s += " (" + c.Message + ")"
		}
		cs = append(cs, s)
	}
	return []string{p.Key(), strings.Join(cs, ", "), p.Reconcile.String()}
}

// KeyIndex is the primary index: Key.
var KeyIndex = statedb.Index[*PolicyConditions, string]{
	Name:       "key",
	FromObject: func(p *PolicyConditions) index.KeySet { return index.NewKeySet(index.String(p.Key())) },
	FromKey:    index.String,
	FromString: index.FromString,
	Unique:     true,
}

// NewTable creates the desired conditions table.
func NewTable(db *statedb.DB) (statedb.RWTable[*PolicyConditions], error) {
	t, err := statedb.NewTable(db, TableName, KeyIndex)
	if err != nil {
		return nil, fmt.Errorf("create table %s: %w", TableName, err)
	}
	return t, nil
}
