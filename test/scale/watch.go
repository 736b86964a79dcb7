package scale

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/statedb/ipcache"
	"github.com/cellium/cellium/statedb/policy"
)

// ipcacheWatch follows the agent's ipcache table through its changes
// stream (GET /v1/statedb/ipcache/changes): it knows which address has
// which identity from the remote pods' writes (rows of one source: a
// CiliumEndpoint's, or in kvstore mode an ipcache key's), and when each
// awaited address first appeared with its identity from that source, as
// the stream delivered it.
type ipcacheWatch struct {
	mu      sync.Mutex
	source  ipcache.Source
	present map[netip.Addr]int64 // the source's entries: address -> identity
	waits   map[netip.Addr]*await
	err     error
	done    chan struct{}
}

// await is one sampled address: since is when its CiliumEndpoint (in
// kvstore mode its ipcache key) was written, seen when the ipcache first
// had it with identity id from the watched source.
type await struct {
	id    int64
	since time.Time
	seen  time.Time
}

// entryJSON is what the watch reads of an ipcache row.
type entryJSON struct {
	Prefix   netip.Prefix   `json:"prefix"`
	Identity int64          `json:"identity"`
	Source   ipcache.Source `json:"source"`
}

// watchIPCache opens the stream and follows the rows of source until ctx
// ends.
func watchIPCache(ctx context.Context, api *client.Client, source ipcache.Source) (*ipcacheWatch, error) {
	s, err := api.WatchStatedbTable(ctx, ipcache.TableName)
	if err != nil {
		return nil, fmt.Errorf("watch the agent's ipcache: %w", err)
	}
	w := &ipcacheWatch{source: source, present: map[netip.Addr]int64{}, waits: map[netip.Addr]*await{}, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer s.Close()
		for {
			ch, err := s.Next()
			if err != nil {
				if ctx.Err() == nil {
					w.mu.Lock()
					w.err = err
					w.mu.Unlock()
				}
				return
			}
			now := time.Now()
			var e entryJSON
			if err := json.Unmarshal(ch.Object, &e); err != nil || !e.Prefix.IsSingleIP() {
				continue
			}
			w.mu.Lock()
			w.apply(e, ch.Deleted, now)
			w.mu.Unlock()
		}
	}()
	return w, nil
}

// apply takes one change of the table (one row per prefix: the winning
// claim's). A row of another source, or none, means the watched source
// has no entry for the address that counts (in kvstore mode: the pod's
// key was deleted and its CiliumEndpoint's claim took over).
func (w *ipcacheWatch) apply(e entryJSON, deleted bool, now time.Time) {
	addr := e.Prefix.Addr()
	if deleted || e.Source != w.source {
		delete(w.present, addr)
		return
	}
	w.present[addr] = e.Identity
	if a := w.waits[addr]; a != nil && a.seen.IsZero() && a.id == e.Identity {
		a.seen = now
	}
}

// expect registers a sampled address about to be written with identity
// id; call before the write.
func (w *ipcacheWatch) expect(addr netip.Addr, id int64, since time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.waits[addr] = &await{id: id, since: since}
}

// latencies returns the latencies of the sampled addresses seen so far
// and how many are still unseen.
func (w *ipcacheWatch) latencies() (got []time.Duration, unseen int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, a := range w.waits {
		if a.seen.IsZero() {
			unseen++
			continue
		}
		got = append(got, a.seen.Sub(a.since))
	}
	return got, unseen
}

// missing counts the pods whose address the ipcache does not map to
// their identity, and returns one of them.
func (w *ipcacheWatch) missing(pods []remotePod) (int, string, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, example := 0, ""
	for _, p := range pods {
		if w.present[p.ip] != identityID(p.identity) {
			n++
			example = p.name + " " + p.ip.String()
		}
	}
	return n, example, w.err
}

// policyWatch follows the local endpoint's row of the agent's desired
// endpoint policy table (endpoint-policies) through its changes stream:
// the identities its ingress allows.
type policyWatch struct {
	mu       sync.Mutex
	endpoint uint16
	ingress  map[int64]bool
	changed  chan struct{} // closed and replaced on every change of the row
	err      error
	others   map[uint16]int // other endpoints' rows: ingress entries, for errors
	last     string         // the row's last JSON, for errors
}

type policyRowJSON struct {
	EndpointID uint16 `json:"endpoint-id"`
	Policy     *struct {
		Revision uint64 `json:"revision"`
		Ingress  struct {
			Entries []struct {
				Identity int64 `json:"identity"` // policy.Key, embedded
			} `json:"entries"`
		} `json:"ingress"`
	} `json:"policy"`
}

func watchPolicy(ctx context.Context, api *client.Client, endpoint uint16) (*policyWatch, error) {
	s, err := api.WatchStatedbTable(ctx, policy.TableName)
	if err != nil {
		return nil, fmt.Errorf("watch the agent's endpoint policies: %w", err)
	}
	w := &policyWatch{endpoint: endpoint, changed: make(chan struct{}), others: map[uint16]int{}}
	go func() {
		defer s.Close()
		for {
			ch, err := s.Next()
			if err != nil {
				w.mu.Lock()
				if ctx.Err() == nil {
					w.err = err
				} else {
					w.err = ctx.Err()
				}
				close(w.changed)
				w.mu.Unlock()
				return
			}
			var row policyRowJSON
			if err := json.Unmarshal(ch.Object, &row); err != nil || ch.Deleted || row.Policy == nil {
				continue
			}
			if row.EndpointID != endpoint {
				w.mu.Lock()
				w.others[row.EndpointID] = len(row.Policy.Ingress.Entries)
				w.mu.Unlock()
				continue
			}
			ids := map[int64]bool{}
			for _, e := range row.Policy.Ingress.Entries {
				ids[e.Identity] = true
			}
			w.mu.Lock()
			w.ingress = ids
			w.last = string(ch.Object[:min(len(ch.Object), 400)])
			close(w.changed)
			w.changed = make(chan struct{})
			w.mu.Unlock()
		}
	}()
	return w, nil
}

// waitFor waits until the row's ingress satisfies ok and returns when the
// stream delivered that row.
func (w *policyWatch) waitFor(ctx context.Context, ok func(map[int64]bool) bool) (time.Time, error) {
	for {
		w.mu.Lock()
		ingress, changed, err := w.ingress, w.changed, w.err
		w.mu.Unlock()
		if ingress != nil && ok(ingress) {
			return time.Now(), nil
		}
		if err != nil {
			return time.Time{}, err
		}
		select {
		case <-ctx.Done():
			w.mu.Lock()
			defer w.mu.Unlock()
			return time.Time{}, errors.Join(ctx.Err(), fmt.Errorf("the local endpoint %d's policy allows %d identities (row %s; other endpoints' rows: %v)",
				w.endpoint, len(ingress), w.last, w.others))
		case <-changed:
		}
	}
}
