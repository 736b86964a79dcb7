package benchdatapath

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/daemon/bpfmaps"
	"github.com/cellium/cellium/datapath/bpfconfig"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/ipcache"
	"github.com/cellium/cellium/statedb/mapstate"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/statedb/reconciler"
)

// ReconcilerRates are the map reconcilers' throughputs.
type ReconcilerRates struct {
	// PolicyEntriesPerSec: policy map entries changed per second when an
	// endpoint's policy of PolicyEntries entries is replaced by one
	// sharing none (each replacement writes PolicyEntries and deletes
	// PolicyEntries), from the endpoint-policies row to the policy-maps
	// row saying the map holds it.
	PolicyEntriesPerSec float64
	PolicyEntries       int
	// IPCachePrefixesPerSec: ipcache rows written into the table at once
	// until every row's status is done (batches into the LPM trie).
	IPCachePrefixesPerSec float64
	IPCachePrefixes       int
	// Rounds is how many times each was measured (the figures are
	// medians).
	Rounds int
}

// reconcilerBench is the agent's BPF map cell (daemon/bpfmaps) on maps
// of its own, its input tables written by the bench.
type reconcilerBench struct {
	h      *hive.Hive
	db     *statedb.DB
	eps    statedb.RWTable[*endpoints.Endpoint]
	pols   statedb.RWTable[*policy.EndpointPolicyRow]
	ipc    statedb.RWTable[*ipcache.Entry]
	pmaps  statedb.Table[*mapstate.PolicyMap]
	pinDir string
}

// measureReconcilers runs the map cell with --bpf-root root (a directory
// on bpffs) and measures both reconcilers rounds times.
func measureReconcilers(ctx context.Context, root string, policyEntries, prefixes, rounds int, logw io.Writer) (out ReconcilerRates, err error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return out, err
	}
	r := &reconcilerBench{}
	h := hive.NewWithOptions(hive.Options{
		Logger:    slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: slog.LevelWarn})),
		LookupEnv: func(string) (string, bool) { return "", false },
	},
		hive.Provide(endpoints.NewTable, policy.NewTable, ipcache.NewTable,
			statedb.RWTable[*endpoints.Endpoint].ToTable, statedb.RWTable[*policy.EndpointPolicyRow].ToTable,
			func(t statedb.RWTable[*ipcache.Entry]) ipcache.StatusTable { return ipcache.StatusTable{RWTable: t} }),
		bpfmaps.Cell,
		capture(&r.db), capture(&r.eps), capture(&r.pols), capture(&r.ipc), capture(&r.pmaps),
	)
	if err := h.Flags().Parse([]string{"--enable-bpf-datapath", "--bpf-root=" + root}); err != nil {
		return out, err
	}
	if err := h.Start(ctx); err != nil {
		return out, fmt.Errorf("start the map cell: %w", err)
	}
	r.h = h
	r.pinDir = filepath.Join(root, bpfconfig.PinSubdir)
	defer func() {
		if serr := h.Stop(context.Background()); serr != nil && err == nil {
			err = fmt.Errorf("stop the map cell: %w", serr)
		}
	}()
	out.PolicyEntries, out.IPCachePrefixes, out.Rounds = policyEntries, prefixes, rounds
	if out.PolicyEntriesPerSec, err = r.policyRate(ctx, policyEntries, rounds); err != nil {
		return out, fmt.Errorf("policy map reconciler: %w", err)
	}
	if out.IPCachePrefixesPerSec, err = r.ipcacheRate(ctx, prefixes, rounds); err != nil {
		return out, fmt.Errorf("ipcache reconciler: %w", err)
	}
	return out, nil
}

// reconcilerPolicy is a policy of n ingress entries whose identities start
// at base, plus the egress allow-all. Revision r uses base 100000 +
// ((r-1)%2)*n: two revisions in a row share no entry.
func reconcilerPolicy(ep uint16, rev uint64, base, n int) *policy.EndpointPolicyRow {
	entries := make([]policy.Entry, n)
	for i := range entries {
		entries[i] = policy.Entry{Key: policy.NewKey(identity.NumericIdentity(base+i/4), policy.Ingress, policy.ProtoTCP, uint16(80+i%4), 16)}
	}
	return &policy.EndpointPolicyRow{EndpointID: ep, Identity: 1234, Policy: &policy.EndpointPolicy{
		Revision: rev,
		Ingress:  policy.DirectionPolicy{Enforcing: true, Entries: entries},
		Egress:   policy.DirectionPolicy{Entries: []policy.Entry{{Key: policy.NewKey(0, policy.Egress, 0, 0, 0)}}},
	}}
}

// waitUntil re-evaluates cond whenever watch's channel closes (at most
// every 5ms) until it holds.
func waitUntil(ctx context.Context, what string, timeout time.Duration, cond func(statedb.ReadTxn) bool, watch func(statedb.ReadTxn) <-chan struct{}, db *statedb.DB) error {
	deadline := time.After(timeout)
	for {
		txn := db.ReadTxn()
		w := watch(txn)
		if cond(txn) {
			return nil
		}
		select {
		case <-w:
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("%s: not within %v", what, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (r *reconcilerBench) policyRate(ctx context.Context, n, rounds int) (float64, error) {
	const ep = 7
	realized := func(rev uint64) error {
		var errStatus error
		err := waitUntil(ctx, fmt.Sprintf("policy revision %d realized", rev), time.Minute, func(txn statedb.ReadTxn) bool {
			row, _, ok := r.pmaps.Get(txn, mapstate.PolicyEndpointIndex.Query(ep))
			if ok && row.Status.Kind == reconciler.StatusError {
				errStatus = fmt.Errorf("policy map update failed: %s", row.Status.Error)
				return true
			}
			return ok && row.Realized == rev
		}, func(txn statedb.ReadTxn) <-chan struct{} { _, w := r.pmaps.AllWatch(txn); return w }, r.db)
		if errStatus != nil {
			return errStatus
		}
		return err
	}
	txn := r.db.WriteTxn(r.eps, r.pols)
	_, _, _ = r.eps.Insert(txn, &endpoints.Endpoint{ID: ep, IPv4: netip.MustParseAddr("10.96.0.7"), Identity: 1234})
	_, _, _ = r.pols.Insert(txn, reconcilerPolicy(ep, 1, 100000, n))
	txn.Commit()
	if err := realized(1); err != nil {
		return 0, err
	}
	rates := make([]float64, 0, rounds)
	for i := range rounds {
		rev := uint64(i + 2)
		start := time.Now()
		txn := r.db.WriteTxn(r.pols)
		_, _, _ = r.pols.Insert(txn, reconcilerPolicy(ep, rev, 100000+int((rev-1)%2)*n, n))
		txn.Commit()
		if err := realized(rev); err != nil {
			return 0, err
		}
		rates = append(rates, float64(2*n)/time.Since(start).Seconds())
	}
	pm, err := maps.OpenPolicyMap(r.pinDir, ep)
	if err != nil {
		return 0, err
	}
	defer pm.Close()
	k := 0
	if err := pm.Iterate(func(policy.Entry) bool { k++; return true }); err != nil || k != n+1 {
		return 0, fmt.Errorf("the policy map holds %d entries (%v), want %d", k, err, n+1)
	}
	return median(rates), nil
}

func (r *reconcilerBench) ipcacheRate(ctx context.Context, n, rounds int) (float64, error) {
	m, err := maps.Open(r.pinDir)
	if err != nil {
		return 0, err
	}
	defer m.Close()
	size := func() (int, error) {
		k := 0
		err := m.IPCache.Iterate(func(netip.Prefix, maps.IPCacheEntry) bool { k++; return true })
		return k, err
	}
	rows := make([]*ipcache.Entry, n)
	for i := range rows {
		a := netip.AddrFrom4([4]byte{10, byte(100 + i>>16), byte(i >> 8), byte(i)})
		rows[i] = &ipcache.Entry{Prefix: netip.PrefixFrom(a, 32), Identity: identity.NumericIdentity(1000 + i%500),
			Source: ipcache.SourceCiliumEndpoint, Status: reconciler.Pending()}
	}
	watch := func(txn statedb.ReadTxn) <-chan struct{} { _, w := r.ipc.AllWatch(txn); return w }
	rates := make([]float64, 0, rounds)
	for range rounds {
		start := time.Now()
		txn := r.db.WriteTxn(r.ipc)
		for _, row := range rows {
			_, _, _ = r.ipc.Insert(txn, row)
		}
		txn.Commit()
		err := waitUntil(ctx, fmt.Sprintf("%d prefixes done", n), time.Minute, func(txn statedb.ReadTxn) bool {
			if r.ipc.NumObjects(txn) != n {
				return false
			}
			for row := range r.ipc.All(txn) {
				if row.Status.Kind != reconciler.StatusDone {
					return false
				}
			}
			return true
		}, watch, r.db)
		if err != nil {
			return 0, err
		}
		rates = append(rates, float64(n)/time.Since(start).Seconds())
		if k, err := size(); err != nil || k != n {
			return 0, fmt.Errorf("the ipcache map holds %d prefixes (%v), want %d", k, err, n)
		}
		// Not timed: remove them again.
		txn = r.db.WriteTxn(r.ipc)
		_ = r.ipc.DeleteAll(txn)
		txn.Commit()
		deadline := time.Now().Add(time.Minute)
		for {
			k, err := size()
			if err != nil {
				return 0, err
			}
			if k == 0 {
				break
			}
			if time.Now().After(deadline) {
				return 0, fmt.Errorf("the ipcache map still holds %d prefixes a minute after their rows went", k)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return median(rates), nil
}
