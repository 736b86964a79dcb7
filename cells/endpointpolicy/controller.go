package endpointpolicy

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	identitycell "github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/policy"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/labels"
	statepolicy "github.com/cellium/cellium/statedb/policy"
)

type controllerParams struct {
	hive.In

	Log        *slog.Logger
	DB         *statedb.DB
	Jobs       hive.Jobs
	Engine     *policy.Engine
	Cluster    identitycell.ClusterName `optional:"true"`
	Policies   statedb.RWTable[*statepolicy.EndpointPolicyRow]
	CIDRs      statedb.RWTable[*statepolicy.CIDRIdentity]
	NPs        statedb.Table[*networkingv1.NetworkPolicy]
	CNPs       statedb.Table[*ciliumv2.CiliumNetworkPolicy]
	CCNPs      statedb.Table[*ciliumv2.CiliumClusterwideNetworkPolicy]
	Identities statedb.Table[*ciliumv2.CiliumIdentity]
	Endpoints  statedb.Table[*endpoints.Endpoint]
	Pods       statedb.Table[*corev1.Pod]
	// Rejected records the policies refused, for GET /v1/policy.
	Rejected *rejections `optional:"true"`
}

func registerController(p controllerParams) {
	c := &controller{p: p, opts: policy.ParseOptions{ClusterName: string(p.Cluster)}, generations: map[policy.Source]int64{}}
	if c.p.Rejected == nil {
		c.p.Rejected = newRejections()
	}
	p.Jobs.Add(hive.Service("compute-endpoint-policies", c.subscribe, c.run))
}

// controller feeds the engine from the tables and writes the policies of
// the endpoints each change affects.
type controller struct {
	p    controllerParams
	opts policy.ParseOptions

	nps   statedb.ChangeIterator[*networkingv1.NetworkPolicy]
	cnps  statedb.ChangeIterator[*ciliumv2.CiliumNetworkPolicy]
	ccnps statedb.ChangeIterator[*ciliumv2.CiliumClusterwideNetworkPolicy]
	// generations is the metadata.generation of each CNP/CCNP last parsed.
	generations map[policy.Source]int64
	ids         statedb.ChangeIterator[*ciliumv2.CiliumIdentity]
	eps         statedb.ChangeIterator[*endpoints.Endpoint]
	pods        statedb.ChangeIterator[*corev1.Pod]
}

func (c *controller) subscribe() error {
	p := c.p
	txn := p.DB.WriteTxn(p.NPs, p.CNPs, p.CCNPs, p.Identities, p.Endpoints, p.Pods)
	defer txn.Commit()
	var err error
	if c.nps, err = p.NPs.Changes(txn); err != nil {
		return err
	}
	if c.cnps, err = p.CNPs.Changes(txn); err != nil {
		return err
	}
	if c.ccnps, err = p.CCNPs.Changes(txn); err != nil {
		return err
	}
	if c.ids, err = p.Identities.Changes(txn); err != nil {
		return err
	}
	if c.eps, err = p.Endpoints.Changes(txn); err != nil {
		return err
	}
	c.pods, err = p.Pods.Changes(txn)
	return err
}

// pending accumulates what a round of changes affects.
type pending struct {
	// seen is when the round that started this set of changes woke up.
	seen    time.Time
	all     bool
	ids     map[identity.NumericIdentity]struct{}
	touched map[uint16]struct{}
	deleted map[uint16]struct{}
}

func (pd *pending) merge(ch policy.Changes) {
	if ch.All {
		pd.all = true
	}
	for id := range ch.Identities {
		pd.ids[id] = struct{}{}
	}
}

func (c *controller) run(ctx context.Context, h hive.Health) {
	defer c.nps.Close()
	defer c.cnps.Close()
	defer c.ccnps.Close()
	defer c.ids.Close()
	defer c.eps.Close()
	defer c.pods.Close()
	pd := &pending{ids: map[identity.NumericIdentity]struct{}{}, touched: map[uint16]struct{}{}, deleted: map[uint16]struct{}{}}
	ws := statedb.NewWatchSet()
	for {
		if pd.seen.IsZero() {
			pd.seen = time.Now()
		}
		rtxn := c.p.DB.ReadTxn()
		ws.Clear()
		watch := func(ch <-chan struct{}) { ws.Add(ch) }

		npCh, w := c.nps.Next(rtxn)
		watch(w)
		for ch := range npCh {
			np := ch.Object
			src := policy.Source{Kind: policy.KindNetworkPolicy, Namespace: np.Namespace, Name: np.Name, UID: string(np.UID)}
			if ch.Deleted {
				pd.merge(c.p.Engine.DeleteRules(src))
				continue
			}
			r, err := policy.ParseNetworkPolicy(np, c.opts)
			var rules []*policy.Rule
			if err != nil {
				c.p.Log.Warn("Ignoring an invalid NetworkPolicy", "policy", src.String(), "error", err)
			} else {
				rules = []*policy.Rule{r}
			}
			pd.merge(c.p.Engine.UpsertRules(src, rules))
		}
		cnpCh, w := c.cnps.Next(rtxn)
		watch(w)
		for ch := range cnpCh {
			o := ch.Object
			src := policy.Source{Kind: policy.KindCNP, Namespace: o.Namespace, Name: o.Name, UID: string(o.UID)}
			if ch.Deleted {
				delete(c.generations, src)
				c.p.Rejected.clear(src)
				pd.merge(c.p.Engine.DeleteRules(src))
				continue
			}
			if c.sameGeneration(src, o.Generation) {
				continue // a status update (the operator's conditions)
			}
			rules, err := policy.ParseCNP(o, c.opts)
			if c.report(src, rules, err) {
				pd.merge(c.p.Engine.UpsertRules(src, rules))
			}
		}
		ccnpCh, w := c.ccnps.Next(rtxn)
		watch(w)
		for ch := range ccnpCh {
			o := ch.Object
			src := policy.Source{Kind: policy.KindCCNP, Name: o.Name, UID: string(o.UID)}
			if ch.Deleted {
				delete(c.generations, src)
				c.p.Rejected.clear(src)
				pd.merge(c.p.Engine.DeleteRules(src))
				continue
			}
			if c.sameGeneration(src, o.Generation) {
				continue
			}
			rules, err := policy.ParseCCNP(o, c.opts)
			if c.report(src, rules, err) {
				pd.merge(c.p.Engine.UpsertRules(src, rules))
			}
		}
		idCh, w := c.ids.Next(rtxn)
		watch(w)
		upserts := map[identity.NumericIdentity]labels.Labels{}
		var deletes []identity.NumericIdentity
		for ch := range idCh {
			id, err := identity.ParseNumericIdentity(ch.Object.Name)
			if err != nil {
				continue
			}
			if ch.Deleted {
				delete(upserts, id)
				deletes = append(deletes, id)
			} else {
				upserts[id] = labels.FromMap(ch.Object.SecurityLabels, "")
			}
		}
		if len(upserts)+len(deletes) > 0 {
			pd.merge(c.p.Engine.UpdateIdentities(upserts, deletes))
		}
		podCh, w := c.pods.Next(rtxn)
		watch(w)
		podsChanged := false
		for range podCh {
			podsChanged = true
		}
		if podsChanged {
			pd.merge(c.p.Engine.SetEgressNamedPorts(podNamedPorts(c.p.Pods.All(rtxn))))
		}
		epCh, w := c.eps.Next(rtxn)
		watch(w)
		for ch := range epCh {
			if ch.Deleted {
				pd.deleted[ch.Object.ID] = struct{}{}
				delete(pd.touched, ch.Object.ID)
			} else {
				pd.touched[ch.Object.ID] = struct{}{}
				delete(pd.deleted, ch.Object.ID)
			}
		}

		// Write nothing until every policy and identity has been listed
		// once: a half-loaded repository would allow too much.
		ready := true
		for _, t := range []interface {
			Initialized(statedb.ReadTxn) (bool, <-chan struct{})
		}{c.p.NPs, c.p.CNPs, c.p.CCNPs, c.p.Identities} {
			if ok, initWatch := t.Initialized(rtxn); !ok {
				ready = false
				watch(initWatch)
			}
		}
		if ready {
			if err := c.apply(rtxn, pd); err != nil {
				// Keep pd: the next change retries what it holds.
				c.p.Log.Error("Writing the endpoint policy tables failed", "error", err)
				h.Degraded("write the endpoint policy tables", err)
			} else {
				pd = &pending{ids: map[identity.NumericIdentity]struct{}{}, touched: map[uint16]struct{}{}, deleted: map[uint16]struct{}{}}
				h.OK("in sync")
			}
		} else {
			pd.all = true
			h.OK("waiting for the policy and identity tables")
		}
		if _, err := ws.Wait(ctx, 0); err != nil {
			return // ctx ended
		}
	}
}

// sameGeneration reports whether the object's spec is the one last parsed
// (same metadata.generation), so that status-only updates do not bump the
// repository revision. Generation 0 (objects that never went through an API
// server) always counts as new.
func (c *controller) sameGeneration(src policy.Source, gen int64) bool {
	if gen == 0 {
		return false
	}
	if c.generations[src] == gen {
		return true
	}
	c.generations[src] = gen
	return false
}

// report logs a policy that failed to parse and parts that are not
// enforced. It returns false when the policy is rejected: as in Cilium, a
// CNP or CCNP with one invalid rule is not imported at all, and the rules
// its previous version had (if any) stay in force. The operator's
// validator reports the error in the policy's Valid condition.
func (c *controller) report(src policy.Source, rules []*policy.Rule, err error) bool {
	if err != nil {
		c.p.Log.Warn("Rejecting an invalid policy; the rules of its previous version, if any, stay in force", "policy", src.String(), "error", err)
		c.p.Rejected.set(src, err)
		return false
	}
	c.p.Rejected.clear(src)
	for _, r := range rules {
		if len(r.Warnings) > 0 {
			c.p.Log.Info("Parts of a policy are not enforced", "policy", src.String(), "warnings", strings.Join(r.Warnings, "; "))
		}
	}
	return true
}

// apply recomputes the affected endpoints and writes the rows that
// changed. It does so in two commits: first it marks the rows of the
// endpoints a repository change affects as pending (the endpoint manager
// shows those endpoints as waiting-to-regenerate), then it writes the
// recomputed rows, which clears the marks. A failed write aborts its
// transaction and is returned.
func (c *controller) apply(rtxn statedb.ReadTxn, pd *pending) error {
	var todo []*endpoints.Endpoint
	for ep := range c.p.Endpoints.All(rtxn) {
		_, touched := pd.touched[ep.ID]
		_, affected := pd.ids[ep.Identity]
		if pd.all || touched || affected {
			todo = append(todo, ep)
		}
	}
	if err := c.markPending(todo); err != nil {
		return err
	}
	txn := c.p.DB.WriteTxn(c.p.Policies, c.p.CIDRs)
	if err := c.writeRows(txn, pd, todo); err != nil {
		txn.Abort()
		return err
	}
	txn.Commit()
	return nil
}

// writeRows writes, in txn, the CIDR identities and the policy rows of the
// endpoints in todo and removes the rows of deleted endpoints.
func (c *controller) writeRows(txn statedb.WriteTxn, pd *pending, todo []*endpoints.Endpoint) error {
	// The CIDR identities first: the datapath must know a prefix's identity
	// before an entry allows or denies it.
	want := c.p.Engine.CIDRIdentities()
	for row := range c.p.CIDRs.All(txn) {
		if id, ok := want[row.Prefix]; !ok || id != row.Identity {
			if _, _, err := c.p.CIDRs.Delete(txn, row); err != nil {
				return fmt.Errorf("delete CIDR identity %s: %w", row.Prefix, err)
			}
		}
	}
	for p, id := range want {
		if cur, _, ok := c.p.CIDRs.Get(txn, statepolicy.CIDRPrefixIndex.Query(p)); !ok || cur.Identity != id {
			if _, _, err := c.p.CIDRs.Insert(txn, &statepolicy.CIDRIdentity{Prefix: p, Identity: id}); err != nil {
				return fmt.Errorf("insert CIDR identity %s: %w", p, err)
			}
		}
	}
	for id := range pd.deleted {
		if row, _, ok := c.p.Policies.Get(txn, statepolicy.EndpointIDIndex.Query(id)); ok {
			if _, _, err := c.p.Policies.Delete(txn, row); err != nil {
				return fmt.Errorf("delete policy of endpoint %d: %w", id, err)
			}
		}
	}
	for _, ep := range todo {
		cur, _, exists := c.p.Policies.Get(txn, statepolicy.EndpointIDIndex.Query(ep.ID))
		if ep.Identity == identity.InvalidIdentity {
			if exists {
				if _, _, err := c.p.Policies.Delete(txn, cur); err != nil {
					return fmt.Errorf("delete policy of endpoint %d: %w", ep.ID, err)
				}
			}
			continue
		}
		pol := c.p.Engine.Compute(policy.Endpoint{Identity: ep.Identity, Labels: ep.Labels, NamedPorts: endpointNamedPorts(ep.NamedPorts)})
		if exists && cur.Identity == ep.Identity && cur.PendingRevision == 0 && cur.Policy.Revision == pol.Revision && cur.Policy.Equal(pol) {
			continue
		}
		if _, _, err := c.p.Policies.Insert(txn, &statepolicy.EndpointPolicyRow{EndpointID: ep.ID, Identity: ep.Identity, Policy: pol, Seen: pd.seen}); err != nil {
			return fmt.Errorf("insert policy of endpoint %d: %w", ep.ID, err)
		}
	}
	return nil
}

// markPending marks, in a commit of its own, the rows of the endpoints in
// todo whose policy was computed at an older repository revision than the
// current one: a rule change affects them and their new policy is about to
// be computed. Rows for another identity need no mark (the endpoint
// manager already sees them as stale). A failed write aborts the
// transaction and is returned.
func (c *controller) markPending(todo []*endpoints.Endpoint) error {
	rev := c.p.Engine.Revision()
	// This job is the table's only writer: a snapshot stays accurate.
	rtxn := c.p.DB.ReadTxn()
	var txn statedb.WriteTxn
	for _, ep := range todo {
		cur, _, ok := c.p.Policies.Get(rtxn, statepolicy.EndpointIDIndex.Query(ep.ID))
		if !ok || cur.Identity != ep.Identity || cur.Policy.Revision >= rev || cur.PendingRevision == rev {
			continue
		}
		if txn == nil {
			txn = c.p.DB.WriteTxn(c.p.Policies)
		}
		if _, _, err := c.p.Policies.Insert(txn, cur.WithPending(rev)); err != nil {
			txn.Abort()
			return fmt.Errorf("mark the policy of endpoint %d pending: %w", ep.ID, err)
		}
	}
	if txn != nil {
		txn.Commit()
	}
	return nil
}

func protoNumber(s string) uint8 {
	switch strings.ToUpper(s) {
	case "TCP", "":
		return statepolicy.ProtoTCP
	case "UDP":
		return statepolicy.ProtoUDP
	case "SCTP":
		return statepolicy.ProtoSCTP
	}
	return 0
}

func endpointNamedPorts(nps ciliumv2.NamedPorts) map[string][]policy.NamedPort {
	if len(nps) == 0 {
		return nil
	}
	out := map[string][]policy.NamedPort{}
	for _, p := range nps {
		if p != nil && p.Name != "" {
			out[p.Name] = append(out[p.Name], policy.NamedPort{Port: p.Port, Proto: protoNumber(p.Protocol)})
		}
	}
	return out
}

// podNamedPorts collects the named container ports of pods.
func podNamedPorts(pods func(func(*corev1.Pod, statedb.Revision) bool)) map[string][]policy.NamedPort {
	out := map[string][]policy.NamedPort{}
	for pod := range pods {
		for _, ctr := range pod.Spec.Containers {
			for _, p := range ctr.Ports {
				if p.Name != "" {
					out[p.Name] = append(out[p.Name], policy.NamedPort{Port: uint16(p.ContainerPort), Proto: protoNumber(string(p.Protocol))})
				}
			}
		}
	}
	return out
}
