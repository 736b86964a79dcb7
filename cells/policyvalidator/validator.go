package policyvalidator

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"time"

	"github.com/cilium/statedb"
	k8serrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	ciliumclient "github.com/cellium/cellium/api/client/clientset/versioned/typed/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/leaderelection"
	"github.com/cellium/cellium/cells/policy"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/reconciler"
	"github.com/cellium/cellium/statedb/tables"
)

// FullInterval is how often every policy's conditions are checked again
// (a status someone else overwrote is written back).
const FullInterval = 5 * time.Minute

type params struct {
	hive.In

	Config    Config
	Log       *slog.Logger
	DB        *statedb.DB
	Jobs      hive.Jobs
	Health    hive.Health
	Clientset k8s.Clientset
	Desired   statedb.RWTable[*PolicyConditions]
	CNPs      statedb.Table[*ciliumv2.CiliumNetworkPolicy]
	CCNPs     statedb.Table[*ciliumv2.CiliumClusterwideNetworkPolicy]
	Metrics   reconciler.Metrics `optional:"true"`
}

// register starts the deriver and contributes the status writer as a
// leader job, unless validation is off or there is no API server.
func register(p params) leaderelection.LeaderJobsOut {
	switch {
	case !p.Config.ValidateNetworkPolicy:
		p.Log.Info("CNP/CCNP validator disabled (--validate-network-policy=false)")
		return leaderelection.LeaderJobsOut{}
	case !p.Clientset.IsEnabled():
		p.Log.Info("CNP/CCNP validator disabled", "reason", k8s.ErrNotConfigured)
		return leaderelection.LeaderJobsOut{}
	}
	txn := p.DB.WriteTxn(p.Desired)
	initDone := p.Desired.RegisterInitializer(txn, "policies")
	txn.Commit()
	d := &deriver{p: p, init: tables.NewInitGate(initDone)}
	p.Jobs.Add(hive.Service("derive-policy-conditions", d.subscribe, d.run))

	cilium := p.Clientset.Cilium().CiliumV2()
	cfg := reconciler.Config[*PolicyConditions]{
		Name:      "policy-conditions",
		Table:     p.Desired,
		GetStatus: func(r *PolicyConditions) reconciler.Status { return r.Reconcile },
		SetStatus: func(r *PolicyConditions, s reconciler.Status) *PolicyConditions {
			c := *r
			c.Reconcile = s
			return &c
		},
		Operations:   &target{db: p.DB, cnps: p.CNPs, ccnps: p.CCNPs, client: cilium, now: time.Now},
		FullInterval: FullInterval,
		RetryMin:     100 * time.Millisecond,
		RetryMax:     30 * time.Second,
		Metrics:      p.Metrics,
	}
	health := p.Health.Scope("status-writer")
	run := func(ctx context.Context) error {
		// A new reconciler per term of leadership: it starts from the
		// whole table.
		r, err := reconciler.New(p.DB, cfg)
		if err != nil {
			return err
		}
		r.Run(ctx, health)
		return nil
	}
	return leaderelection.LeaderJobsOut{Jobs: []leaderelection.LeaderJob{{Name: "policy-status-writer", Run: run}}}
}

// Desired computes the row of a CNP or CCNP.
func desiredCNP(cnp *ciliumv2.CiliumNetworkPolicy, opts policy.ParseOptions) *PolicyConditions {
	return &PolicyConditions{Kind: KindCNP, Namespace: cnp.Namespace, Name: cnp.Name, UID: string(cnp.UID),
		Conditions: policy.CNPConditions(cnp, opts)}
}

func desiredCCNP(ccnp *ciliumv2.CiliumClusterwideNetworkPolicy, opts policy.ParseOptions) *PolicyConditions {
	return &PolicyConditions{Kind: KindCCNP, Name: ccnp.Name, UID: string(ccnp.UID),
		Conditions: policy.CCNPConditions(ccnp, opts)}
}

// deriver turns the policy tables into desired conditions.
type deriver struct {
	p     params
	init  tables.InitGate
	cnps  statedb.ChangeIterator[*ciliumv2.CiliumNetworkPolicy]
	ccnps statedb.ChangeIterator[*ciliumv2.CiliumClusterwideNetworkPolicy]
}

func (d *deriver) subscribe() error {
	txn := d.p.DB.WriteTxn(d.p.CNPs, d.p.CCNPs)
	defer txn.Commit()
	var err error
	if d.cnps, err = d.p.CNPs.Changes(txn); err != nil {
		return err
	}
	d.ccnps, err = d.p.CCNPs.Changes(txn)
	return err
}

func (d *deriver) run(ctx context.Context, h hive.Health) {
	defer d.cnps.Close()
	defer d.ccnps.Close()
	for {
		watches, err := d.step()
		if err != nil {
			d.p.Log.Error("Writing the desired policy conditions failed", "error", err)
			h.Degraded("write the desired policy conditions", err)
		} else {
			h.OK("in sync")
		}
		select {
		case <-ctx.Done():
			return
		case <-watches[0]:
		case <-watches[1]:
		case <-watches[2]:
		}
	}
}

// step writes the desired rows of the CNPs and CCNPs changed since the last
// step and returns the channels to wait on before the next: the two change
// streams and, until both tables are initialized, the initialization watch
// (nil afterwards: its closed channel would spin the loop). Rows that fail
// to be written are skipped and their errors returned; the others are
// committed.
func (d *deriver) step() ([3]<-chan struct{}, error) {
	// The cluster name only scopes selectors; validity does not depend on it.
	opts := policy.ParseOptions{}
	rtxn := d.p.DB.ReadTxn()
	txn := d.p.DB.WriteTxn(d.p.Desired)
	defer txn.Commit()
	var errs []error
	cnpCh, cnpWatch := d.cnps.Next(rtxn)
	for c := range cnpCh {
		if err := d.apply(txn, desiredCNP(c.Object, opts), c.Deleted); err != nil {
			errs = append(errs, err)
		}
	}
	ccnpCh, ccnpWatch := d.ccnps.Next(rtxn)
	for c := range ccnpCh {
		if err := d.apply(txn, desiredCCNP(c.Object, opts), c.Deleted); err != nil {
			errs = append(errs, err)
		}
	}
	initWatch := tables.InitWatch(rtxn, d.p.CNPs, d.p.CCNPs)
	if d.init.Closed() && initWatch == nil {
		d.init.Open(txn)
	}
	return [3]<-chan struct{}{cnpWatch, ccnpWatch, initWatch}, errors.Join(errs...)
}

// apply writes want (or deletes its row) unless nothing changes.
func (d *deriver) apply(txn statedb.WriteTxn, want *PolicyConditions, deleted bool) error {
	cur, _, exists := d.p.Desired.Get(txn, KeyIndex.Query(want.Key()))
	switch {
	case deleted:
		if exists && cur.UID == want.UID {
			if _, _, err := d.p.Desired.Delete(txn, cur); err != nil {
				return fmt.Errorf("delete the desired conditions of %s: %w", want.Key(), err)
			}
		}
	case exists && cur.sameAs(want):
	default:
		want.Reconcile = reconciler.Pending()
		if _, _, err := d.p.Desired.Insert(txn, want); err != nil {
			return fmt.Errorf("insert the desired conditions of %s: %w", want.Key(), err)
		}
	}
	return nil
}

// target writes the conditions into the policies' status subresource.
type target struct {
	db     *statedb.DB
	cnps   statedb.Table[*ciliumv2.CiliumNetworkPolicy]
	ccnps  statedb.Table[*ciliumv2.CiliumClusterwideNetworkPolicy]
	client ciliumclient.CiliumV2Interface
	now    func() time.Time
}

// Update sets the row's conditions on the object it names, if that
// object (same UID) still exists and its status differs.
func (t *target) Update(ctx context.Context, _ statedb.ReadTxn, r *PolicyConditions) error {
	now := metav1.NewTime(t.now())
	rtxn := t.db.ReadTxn()
	var err error
	switch r.Kind {
	case KindCNP:
		cur, _, ok := t.cnps.Get(rtxn, k8stables.NameIndex[*ciliumv2.CiliumNetworkPolicy]().Query(r.Namespace+"/"+r.Name))
		if !ok || string(cur.UID) != r.UID {
			return nil // gone or replaced: its own row follows
		}
		conds, changed := policy.MergeConditions(cur.Status.Conditions, r.Conditions, now)
		if !changed {
			return nil
		}
		next := cur.DeepCopy()
		next.Status.Conditions = conds
		_, err = t.client.CiliumNetworkPolicies(r.Namespace).UpdateStatus(ctx, next, metav1.UpdateOptions{})
	case KindCCNP:
		cur, _, ok := t.ccnps.Get(rtxn, k8stables.NameIndex[*ciliumv2.CiliumClusterwideNetworkPolicy]().Query(r.Name))
		if !ok || string(cur.UID) != r.UID {
			return nil
		}
		conds, changed := policy.MergeConditions(cur.Status.Conditions, r.Conditions, now)
		if !changed {
			return nil
		}
		next := cur.DeepCopy()
		next.Status.Conditions = conds
		_, err = t.client.CiliumClusterwideNetworkPolicies().UpdateStatus(ctx, next, metav1.UpdateOptions{})
	}
	if err != nil && !k8serrors.IsNotFound(err) {
		// A conflict means the mirror lags behind: the retry reads it again.
		return fmt.Errorf("update status of %s: %w", r.Key(), err)
	}
	return nil
}

// Delete does nothing: the conditions go with their object.
func (t *target) Delete(context.Context, statedb.ReadTxn, *PolicyConditions) error { return nil }

// Prune does nothing: there is nothing to remove from the API server.
func (t *target) Prune(context.Context, statedb.ReadTxn, iter.Seq2[*PolicyConditions, statedb.Revision]) error {
	return nil
}
