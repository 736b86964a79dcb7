package ipcache_test

import (
	"testing"

	"github.com/cellium/cellium/statedb/ipcache"
)

// The documented precedence: host > endpoint > health > remote-node >
// kvstore > cilium-endpoint > policy-cidr > anything unknown.
func TestPrecedence(t *testing.T) {
	order := []ipcache.Source{ipcache.SourceHost, ipcache.SourceEndpoint, ipcache.SourceHealth,
		ipcache.SourceRemoteNode, ipcache.SourceKVStore, ipcache.SourceCiliumEndpoint, ipcache.SourceServiceFrontend, ipcache.SourceNodeCIDR, ipcache.SourcePolicyCIDR, "unknown"}
	for i := 1; i < len(order); i++ {
		if order[i-1].Precedence() <= order[i].Precedence() {
			t.Errorf("%s (%d) does not beat %s (%d)", order[i-1], order[i-1].Precedence(), order[i], order[i].Precedence())
		}
	}
}
