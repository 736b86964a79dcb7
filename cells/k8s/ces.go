package k8s

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"

	"github.com/cilium/statedb"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/cilium.io/v2alpha1"
	"github.com/cellium/cellium/cells/hive"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/tables"
)

// FlagEnableCiliumEndpointSlice switches CiliumEndpointSlices on (Cilium's
// name, for the agent and the operator alike).
const FlagEnableCiliumEndpointSlice = "enable-cilium-endpoint-slice"

// SliceConfig is the agent's CiliumEndpointSlice switch.
type SliceConfig struct {
	// EnableCiliumEndpointSlice makes the agent learn other nodes'
	// endpoints from CiliumEndpointSlices instead of watching every
	// CiliumEndpoint.
	EnableCiliumEndpointSlice bool
}

// Flags registers --enable-cilium-endpoint-slice.
func (def SliceConfig) Flags(fs *pflag.FlagSet) {
	fs.Bool(FlagEnableCiliumEndpointSlice, def.EnableCiliumEndpointSlice,
		"Learn the cluster's CiliumEndpoints from the CiliumEndpointSlices the operator writes instead of watching every CiliumEndpoint (the operator needs the same flag)")
}

// Validate accepts any value.
func (SliceConfig) Validate() error { return nil }

// CiliumEndpointSlicesCell mirrors CiliumEndpointSlices (the operator's
// input: the slices it wrote before).
var CiliumEndpointSlicesCell = resource("cilium-endpoint-slices", "CiliumEndpointSlices", k8stables.NewCiliumEndpointSlicesTable,
	func() listWatch { return ciliumEndpointSlicesLW })

// ciliumEndpointSlicesLW lists and watches every CiliumEndpointSlice.
func ciliumEndpointSlicesLW(cs Clientset) cache.ListerWatcher {
	c := cs.Cilium().CiliumV2alpha1().CiliumEndpointSlices()
	return typedLW(c.List, c.Watch, fields.Everything())
}

// AgentCiliumEndpointsCell is the agent's CiliumEndpoint table. It mirrors
// every CiliumEndpoint, or, with --enable-cilium-endpoint-slice, holds the
// CiliumEndpoints rebuilt from the CiliumEndpointSlices (each as
// v2alpha1.CoreCiliumEndpoint.CiliumEndpoint makes it), so that whoever
// reads the table (the ipcache, the CEP synchronizer) works the same
// either way.
var AgentCiliumEndpointsCell = hive.Module("cilium-endpoints", "CiliumEndpoints, or the CiliumEndpointSlices that batch them",
	// --enable-cilium-endpoint-slice.
	hive.Config(SliceConfig{}),
	// The table is written only by this module's reflector.
	hive.ProvidePrivate(k8stables.NewCiliumEndpointsTable),
	// Everyone else reads it.
	hive.Provide(statedb.RWTable[*ciliumv2.CiliumEndpoint].ToTable),
	// The reflector of CiliumEndpoints or of slices.
	hive.Invoke(registerCEPsOrSlices),
)

func registerCEPsOrSlices(cfg SliceConfig, db *statedb.DB, table statedb.RWTable[*ciliumv2.CiliumEndpoint], cs Clientset, jobs hive.Jobs) error {
	if !cfg.EnableCiliumEndpointSlice {
		txn := db.WriteTxn(table)
		done := table.RegisterInitializer(txn, "k8s-reflector")
		txn.Commit()
		addReflectorJob(jobs, table.Name(), cs, ciliumEndpointsLW, &ciliumv2.CiliumEndpoint{}, newCEPStore(db, table, done))
		return nil
	}
	txn := db.WriteTxn(table)
	done := table.RegisterInitializer(txn, "k8s-slice-reflector")
	txn.Commit()
	addReflectorJob(jobs, k8stables.CiliumEndpointSlicesTable, cs, ciliumEndpointSlicesLW,
		&v2alpha1.CiliumEndpointSlice{}, NewSliceStore(db, table, done))
	return nil
}

// newCEPStore returns the reflector's store of CiliumEndpoints, which
// keeps them slimmed (see cepSlimmer).
func newCEPStore(db *statedb.DB, table statedb.RWTable[*ciliumv2.CiliumEndpoint], initDone func(statedb.WriteTxn)) *tableStore[*ciliumv2.CiliumEndpoint] {
	return &tableStore[*ciliumv2.CiliumEndpoint]{db: db, table: table, init: tables.NewInitGate(initDone), slim: newCEPSlimmer().slim}
}

// newIdentityStore returns the reflector's store of CiliumIdentities.
func newIdentityStore(db *statedb.DB, table statedb.RWTable[*ciliumv2.CiliumIdentity], initDone func(statedb.WriteTxn)) *tableStore[*ciliumv2.CiliumIdentity] {
	return &tableStore[*ciliumv2.CiliumIdentity]{db: db, table: table, init: tables.NewInitGate(initDone), slim: newIdentitySlimmer().slim}
}

var _ cache.ReflectorStore = (*SliceStore)(nil)

// SliceStore is a reflector's store of CiliumEndpointSlices that keeps a
// CiliumEndpoint table equal to the endpoints the slices hold. An endpoint
// that two slices hold for a moment (the operator moves it: it writes the
// slice it joins before the one it leaves) is taken from the slice
// written last (the higher resourceVersion).
//
// It keeps no slice: only the names of each slice's endpoints and, for
// each endpoint, the CiliumEndpoint each of its slices makes of it (the
// table's row is one of them), so an endpoint costs one CiliumEndpoint
// and not a slice's entry too.
type SliceStore struct {
	db    *statedb.DB
	table statedb.RWTable[*ciliumv2.CiliumEndpoint]
	init  tables.InitGate
	slim  *cepSlimmer

	// slices are the keys ("namespace/name") of each slice's endpoints,
	// by slice name; holders what the slices holding each endpoint say
	// of it, by key.
	slices  map[string][]string
	holders map[string][]heldCEP
}

// heldCEP is one slice's CiliumEndpoint.
type heldCEP struct {
	slice, resourceVersion string
	cep                    *ciliumv2.CiliumEndpoint
}

// NewSliceStore returns a store that writes table; initDone (nil: none)
// is called in the transaction of the first Replace.
func NewSliceStore(db *statedb.DB, table statedb.RWTable[*ciliumv2.CiliumEndpoint], initDone func(statedb.WriteTxn)) *SliceStore {
	s := &SliceStore{db: db, table: table, slim: newCEPSlimmer(),
		slices: map[string][]string{}, holders: map[string][]heldCEP{}}
	if initDone != nil {
		s.init.Add(initDone)
	}
	return s
}

// Add adds one slice.
func (s *SliceStore) Add(obj any) error { return s.Update(obj) }

// Resync does nothing.
func (s *SliceStore) Resync() error { return nil }

// Update replaces one slice.
func (s *SliceStore) Update(obj any) error {
	ces, ok := obj.(*v2alpha1.CiliumEndpointSlice)
	if !ok {
		return fmt.Errorf("CiliumEndpointSlice store: unexpected object %T", obj)
	}
	touched := map[string]struct{}{}
	s.forget(ces.Name, touched)
	s.hold(ces, touched)
	return s.write(touched, false)
}

// Delete forgets one slice.
func (s *SliceStore) Delete(obj any) error {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	ces, ok := obj.(*v2alpha1.CiliumEndpointSlice)
	if !ok {
		return fmt.Errorf("CiliumEndpointSlice store: unexpected object %T", obj)
	}
	touched := map[string]struct{}{}
	s.forget(ces.Name, touched)
	return s.write(touched, false)
}

// Replace makes the table exactly the endpoints of the listed slices and,
// the first time, marks it initialized.
func (s *SliceStore) Replace(list []any, _ string) error {
	touched := map[string]struct{}{}
	for name := range s.slices {
		s.forget(name, touched)
	}
	for _, item := range list {
		ces, ok := item.(*v2alpha1.CiliumEndpointSlice)
		if !ok {
			return fmt.Errorf("CiliumEndpointSlice store: unexpected object %T", item)
		}
		s.hold(ces, touched)
	}
	return s.write(touched, true)
}

func (s *SliceStore) forget(name string, touched map[string]struct{}) {
	keys, ok := s.slices[name]
	if !ok {
		return
	}
	delete(s.slices, name)
	for _, key := range keys {
		touched[key] = struct{}{}
		h := slices.DeleteFunc(s.holders[key], func(h heldCEP) bool { return h.slice == name })
		if len(h) == 0 {
			delete(s.holders, key)
		} else {
			s.holders[key] = h
		}
	}
}

func (s *SliceStore) hold(ces *v2alpha1.CiliumEndpointSlice, touched map[string]struct{}) {
	keys := make([]string, 0, len(ces.Endpoints))
	for i := range ces.Endpoints {
		e := &ces.Endpoints[i]
		key := cepKey(ces.Namespace, e.Name)
		if slices.ContainsFunc(s.holders[key], func(h heldCEP) bool { return h.slice == ces.Name }) {
			continue // the slice names the endpoint twice: the first counts
		}
		keys = append(keys, key)
		touched[key] = struct{}{}
		s.holders[key] = append(s.holders[key], heldCEP{slice: ces.Name, resourceVersion: ces.ResourceVersion,
			cep: s.slim.slim(e.CiliumEndpoint(ces.Namespace))})
	}
	s.slices[ces.Name] = keys
}

// cepKey is the table key (k8stables.Key) of the CiliumEndpoint name in
// namespace ns: a slice without a namespace makes CiliumEndpoints without
// one, whose keys are their names.
func cepKey(ns, name string) string {
	if ns == "" {
		return name
	}
	return ns + "/" + name
}

// current returns the endpoint key as the slice written last shows it.
func (s *SliceStore) current(key string) (*ciliumv2.CiliumEndpoint, bool) {
	h := s.holders[key]
	if len(h) == 0 {
		return nil, false
	}
	best := h[0]
	for _, c := range h[1:] {
		if newerSlice(c.resourceVersion, c.slice, best.resourceVersion, best.slice) {
			best = c
		}
	}
	return best.cep, true
}

// newerSlice reports whether slice a (resourceVersion rva) was written
// after slice b, by resourceVersion (numbers, as every API server backed
// by etcd hands out), ties broken by name.
func newerSlice(rva, a, rvb, b string) bool {
	ra, errA := strconv.ParseUint(rva, 10, 64)
	rb, errB := strconv.ParseUint(rvb, 10, 64)
	if errA == nil && errB == nil && ra != rb {
		return ra > rb
	}
	return cmp.Compare(a, b) > 0
}

func (s *SliceStore) write(touched map[string]struct{}, replace bool) error {
	txn := s.db.WriteTxn(s.table)
	defer txn.Abort()
	q := k8stables.NameIndex[*ciliumv2.CiliumEndpoint]()
	for key := range touched {
		old, _, found := s.table.Get(txn, q.Query(key))
		cep, ok := s.current(key)
		switch {
		case ok && found && sameCEP(old, cep):
		case ok:
			if _, _, err := s.table.Insert(txn, cep); err != nil {
				return err
			}
		case found:
			if _, _, err := s.table.Delete(txn, old); err != nil {
				return err
			}
		}
	}
	if replace {
		// Rows no slice holds (none should be: every row came from one).
		for cep := range s.table.All(txn) {
			if _, held := s.holders[k8stables.Key(cep)]; !held {
				if _, _, err := s.table.Delete(txn, cep); err != nil {
					return err
				}
			}
		}
		s.init.Open(txn)
	}
	txn.Commit()
	return nil
}

func sameCEP(a, b *ciliumv2.CiliumEndpoint) bool {
	return equality.Semantic.DeepEqual(a.OwnerReferences, b.OwnerReferences) && equality.Semantic.DeepEqual(a.Status, b.Status)
}
