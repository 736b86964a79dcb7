package kvstoresync

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/cilium/statedb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/statedb/endpoints"
	kvtables "github.com/cellium/cellium/statedb/kvstore"
	"github.com/cellium/cellium/statedb/nodes"
)

// writer keeps an ipcache key, with the session lease, for each local
// endpoint that has an identity (not the health endpoint: other nodes
// know it from the node key, as in Cilium), and deletes the keys of
// endpoints that went. It writes everything again when the lease
// changes, and a key it wrote that someone deleted (seen in the mirror's
// table) at once.
type writer struct {
	kv        *kvstore.Client
	db        *statedb.DB
	endpoints statedb.Table[*endpoints.Endpoint]
	localNode statedb.Table[*nodes.LocalNode]
	mirrored  statedb.Table[*kvtables.IPEntry]
	node      string
	log       *slog.Logger

	written map[string]written
	// cleaned is set once the keys of this node that a previous run
	// left behind have been deleted.
	cleaned bool
}

// written is what the writer last put under a key.
type written struct {
	prefix netip.Prefix
	value  []byte
	lease  clientv3.LeaseID
	rev    int64
	// seen is set once the mirror showed the key at rev or later: its
	// absence from the mirror then means someone deleted it.
	seen bool
}

// desired is the keys and values this node's endpoints call for.
func (w *writer) desired(txn statedb.ReadTxn) (map[string][]byte, map[string]netip.Prefix, map[netip.Addr]bool, bool) {
	ln, _, ok := w.localNode.Get(txn, nodes.LocalNodeNameIndex.Query(w.node))
	if !ok || !ln.InternalIP.IsValid() {
		return nil, nil, nil, false
	}
	host := ln.InternalIP.Unmap()
	want := map[string][]byte{}
	prefixes := map[string]netip.Prefix{}
	addrs := map[netip.Addr]bool{}
	for ep := range w.endpoints.All(txn) {
		if !ep.IPv4.IsValid() {
			continue
		}
		addrs[ep.IPv4.Unmap()] = true
		if ep.Health || ep.Identity == 0 {
			continue
		}
		ip := ep.IPv4.Unmap()
		pair := kvstore.IPIdentityPair{
			IP: net.IP(ip.AsSlice()), HostIP: net.IP(host.AsSlice()), ID: ep.Identity,
			Metadata:     kvstore.EndpointMetadata(w.node, ep.ID),
			K8sNamespace: ep.PodNamespace, K8sPodName: ep.PodName, K8sServiceAccount: ep.ServiceAccount,
		}
		for _, np := range ep.NamedPorts {
			if np == nil {
				continue
			}
			pair.NamedPorts = append(pair.NamedPorts, kvstore.NamedPortJSON{Name: np.Name, Port: np.Port, Protocol: string(np.Protocol)})
		}
		slices.SortFunc(pair.NamedPorts, func(a, b kvstore.NamedPortJSON) int { return strings.Compare(a.Name, b.Name) })
		v, err := json.Marshal(pair)
		if err != nil {
			continue
		}
		key := kvstore.IPKey(ip)
		want[key] = v
		prefixes[key] = netip.PrefixFrom(ip, ip.BitLen())
	}
	return want, prefixes, addrs, true
}

func (w *writer) run(ctx context.Context, h hive.Health) {
	w.written = map[string]written{}
	var retry <-chan time.Time
	for {
		rtxn := w.db.ReadTxn()
		_, epWatch := w.endpoints.AllWatch(rtxn)
		_, lnWatch := w.localNode.AllWatch(rtxn)
		_, mirWatch := w.mirrored.AllWatch(rtxn)
		lease, leaseWatch := w.kv.Session()
		if retry == nil {
			if err := w.sync(ctx, rtxn, lease); err != nil {
				if ctx.Err() != nil {
					return
				}
				h.Degraded("write ipcache keys", err)
				retry = time.After(time.Second)
			} else if lease != 0 {
				h.OK(fmt.Sprintf("%d ipcache keys written", len(w.written)))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-epWatch:
		case <-lnWatch:
		case <-mirWatch:
		case <-leaseWatch:
		case <-retry:
			retry = nil
		}
	}
}

// sync writes what changed; nothing without a lease (the keys are written
// when one is granted).
func (w *writer) sync(ctx context.Context, rtxn statedb.ReadTxn, lease clientv3.LeaseID) error {
	want, prefixes, addrs, ok := w.desired(rtxn)
	if !ok || lease == 0 {
		return nil
	}
	mirrorReady, _ := w.mirrored.Initialized(rtxn)
	// What the mirror shows of the keys written: a key seen and then gone
	// was deleted by someone else, and is written again.
	for key, wr := range w.written {
		row, _, found := w.mirrored.Get(rtxn, kvtables.IPPrefixIndex.Query(wr.prefix))
		switch {
		case found && row.ModRevision >= wr.rev:
			wr.seen = true
			w.written[key] = wr
		case !found && wr.seen && mirrorReady:
			w.log.Warn("An ipcache key of a local endpoint was deleted by someone else; writing it again", "key", key)
			delete(w.written, key)
		}
	}
	var errs []error
	for key, v := range want {
		if wr, ok := w.written[key]; ok && wr.lease == lease && string(wr.value) == string(v) {
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := w.kv.Etcd().Put(wctx, key, string(v), clientv3.WithLease(lease))
		cancel()
		if err != nil {
			// etcd is likely unreachable: the others wait for the retry
			// rather than each for its timeout.
			return fmt.Errorf("write %s: %w", key, err)
		}
		w.written[key] = written{prefix: prefixes[key], value: v, lease: lease, rev: resp.Header.Revision}
	}
	for key := range w.written {
		if _, ok := want[key]; ok {
			continue
		}
		if err := w.delete(ctx, key); err != nil {
			return err
		}
		delete(w.written, key)
	}
	if epsReady, _ := w.endpoints.Initialized(rtxn); !w.cleaned && mirrorReady && epsReady {
		// Keys a previous run of this agent wrote for endpoints that no
		// longer exist (their old lease has not expired yet); only once
		// the endpoints are restored, so that a restored endpoint's key
		// stays.
		prefix := kvstore.NodeMetadataPrefix(w.node)
		for row := range w.mirrored.All(rtxn) {
			key := kvstore.IPKeysPrefix + keyName(row.Prefix)
			if !strings.HasPrefix(row.Metadata, prefix) || addrs[row.Prefix.Addr()] || want[key] != nil {
				continue
			}
			if err := w.delete(ctx, key); err != nil {
				errs = append(errs, err)
			}
		}
		w.cleaned = len(errs) == 0
	}
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

func (w *writer) delete(ctx context.Context, key string) error {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := w.kv.Etcd().Delete(dctx, key); err != nil {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	return nil
}

// keyName is the last part of the key of p, as Cilium names it.
func keyName(p netip.Prefix) string {
	if p.Bits() == p.Addr().BitLen() {
		return p.Addr().String()
	}
	return p.String()
}
