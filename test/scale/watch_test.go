package scale

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cellium/cellium/statedb/ipcache"
)

// In kvstore mode the watch counts a pod only while its ipcache key's row
// (source kvstore) is the table's: a sampled pod is seen when that row
// arrives, not when its CiliumEndpoint's does, and a pod whose key was
// deleted (its CiliumEndpoint's row taking over) is missing.
func TestIPCacheWatchKVStoreSource(t *testing.T) {
	r := &runner{cfg: Config{Mode: ModeKVStore}}
	w := &ipcacheWatch{source: r.ipcacheSource(), present: map[netip.Addr]int64{}, waits: map[netip.Addr]*await{}}
	p := remotePod{name: "pod-1", node: 0, identity: 0, ip: netip.MustParseAddr("10.1.0.1")}
	row := func(src ipcache.Source) entryJSON {
		return entryJSON{Prefix: netip.PrefixFrom(p.ip, 32), Identity: identityID(0), Source: src}
	}
	t0 := time.Now()
	w.expect(p.ip, identityID(0), t0)
	w.apply(row(ipcache.SourceCiliumEndpoint), false, t0.Add(time.Millisecond))
	if n, _, _ := w.missing([]remotePod{p}); n != 1 {
		t.Errorf("the CiliumEndpoint's row counts in kvstore mode")
	}
	if got, unseen := w.latencies(); len(got) != 0 || unseen != 1 {
		t.Errorf("sample seen from the CiliumEndpoint's row: %v", got)
	}
	w.apply(row(ipcache.SourceKVStore), false, t0.Add(5*time.Millisecond))
	if n, _, _ := w.missing([]remotePod{p}); n != 0 {
		t.Errorf("the key's row does not count")
	}
	if got, unseen := w.latencies(); len(got) != 1 || unseen != 0 || got[0] != 5*time.Millisecond {
		t.Errorf("latencies %v (%d unseen), want 5ms from the key's put", got, unseen)
	}
	// The key deleted: the CiliumEndpoint's row takes over.
	w.apply(row(ipcache.SourceCiliumEndpoint), false, t0.Add(time.Second))
	if n, _, _ := w.missing([]remotePod{p}); n != 1 {
		t.Errorf("a pod whose key is gone still counts")
	}
	w.apply(row(ipcache.SourceKVStore), false, t0.Add(2*time.Second))
	w.apply(row(ipcache.SourceKVStore), true, t0.Add(3*time.Second))
	if n, _, _ := w.missing([]remotePod{p}); n != 1 {
		t.Errorf("a deleted row still counts")
	}

	// CEP mode watches the CiliumEndpoints' rows, as before.
	if src := (&runner{cfg: Config{Mode: ModeCEP}}).ipcacheSource(); src != ipcache.SourceCiliumEndpoint {
		t.Errorf("CEP mode watches %s", src)
	}
}
