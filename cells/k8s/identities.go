package k8s

import (
	"github.com/cilium/statedb"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/tables"
)

// CiliumIdentitiesSource replaces the API server as the source of the
// CiliumIdentity table when LW is set: in kvstore identity mode
// (--identity-allocation-mode=kvstore) the identities live in etcd and
// the kvstore cells present them as CiliumIdentity objects, so that every
// reader of the table works the same in both modes.
type CiliumIdentitiesSource struct {
	// LW lists and watches the identities; nil means the API server.
	LW cache.ListerWatcher
}

// CiliumIdentitiesCell mirrors CiliumIdentities, from the API server or
// from a CiliumIdentitiesSource.
var CiliumIdentitiesCell = hive.Module("cilium-identities", "CiliumIdentities",
	// The table is written only by this module's reflector.
	hive.ProvidePrivate(k8stables.NewCiliumIdentitiesTable),
	// Everyone else reads it.
	hive.Provide(statedb.RWTable[*ciliumv2.CiliumIdentity].ToTable),
	// The reflector job; it marks the table initialized after the first list.
	hive.Invoke(registerIdentitiesReflector),
)

type identitiesReflectorParams struct {
	hive.In

	DB        *statedb.DB
	Table     statedb.RWTable[*ciliumv2.CiliumIdentity]
	Clientset Clientset
	Source    CiliumIdentitiesSource `optional:"true"`
	Jobs      hive.Jobs
}

func registerIdentitiesReflector(p identitiesReflectorParams) error {
	var zero *ciliumv2.CiliumIdentity
	if p.Source.LW == nil {
		txn := p.DB.WriteTxn(p.Table)
		done := p.Table.RegisterInitializer(txn, "k8s-reflector")
		txn.Commit()
		addReflectorJob(p.Jobs, p.Table.Name(), p.Clientset, func(cs Clientset) cache.ListerWatcher {
			c := cs.Cilium().CiliumV2().CiliumIdentities()
			return typedLW(c.List, c.Watch, fields.Everything())
		}, zero, &tableStore[*ciliumv2.CiliumIdentity]{db: p.DB, table: p.Table, init: tables.NewInitGate(done), slim: newIdentitySlimmer().slim})
		return nil
	}
	txn := p.DB.WriteTxn(p.Table)
	done := p.Table.RegisterInitializer(txn, "kvstore-reflector")
	txn.Commit()
	lw := p.Source.LW
	addReflectorJob(p.Jobs, p.Table.Name(), enabled{p.Clientset}, func(Clientset) cache.ListerWatcher { return lw },
		zero, &tableStore[*ciliumv2.CiliumIdentity]{db: p.DB, table: p.Table, init: tables.NewInitGate(done), slim: newIdentitySlimmer().slim})
	return nil
}

// enabled is a clientset that passes the reflector's IsEnabled check: the
// source is not the API server.
type enabled struct{ Clientset }

func (enabled) IsEnabled() bool { return true }
