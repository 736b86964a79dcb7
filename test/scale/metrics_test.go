package scale

import (
	"strings"
	"testing"
)

func TestParseSamples(t *testing.T) {
	in := `# HELP x y
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 1.2e+07
apiserver_watch_events_total{group="cilium.io",kind="CiliumEndpoint",version="v2"} 10
apiserver_watch_events_total{group="",kind="Pod",version="v1"} 5 1700000000
etcd_mvcc_db_total_size_in_bytes 4.096e+06
`
	s, err := parseSamples(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if got := s.get("process_resident_memory_bytes"); got != 1.2e7 {
		t.Errorf("rss = %v", got)
	}
	if got := s.sum("apiserver_watch_events_total"); got != 15 {
		t.Errorf("watch events = %v, want 15", got)
	}
	if got := s.sum("apiserver_watch_events_total", `group="cilium.io"`); got != 10 {
		t.Errorf("cilium.io watch events = %v, want 10", got)
	}
	if got := s.get("etcd_mvcc_db_total_size_in_bytes"); got != 4096e3 {
		t.Errorf("etcd = %v", got)
	}
}
