package kvstore

import (
	"strings"
	"testing"
)

// An endpoint's Metadata is Cilium's "cilium-global:default:<node>:<ID>",
// and a node's prefix matches its own endpoints only, not those of a node
// whose name extends it.
func TestNodeMetadataPrefix(t *testing.T) {
	if got, want := EndpointMetadata("node-1", 12), "cilium-global:default:node-1:12"; got != want {
		t.Errorf("EndpointMetadata = %q, want %q", got, want)
	}
	prefix := NodeMetadataPrefix("node-1")
	if !strings.HasPrefix(EndpointMetadata("node-1", 0), prefix) || !strings.HasPrefix(EndpointMetadata("node-1", 4095), prefix) {
		t.Errorf("prefix %q does not match node-1's endpoints", prefix)
	}
	if strings.HasPrefix(EndpointMetadata("node-10", 1), prefix) {
		t.Errorf("prefix %q matches node-10's endpoints", prefix)
	}
}
