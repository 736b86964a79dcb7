package parser

import (
	"sync"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
)

// Keys of the flow extension naming the ends' nodes.
const (
	// ExtSourceNode is the name of the node the source address lives on.
	ExtSourceNode = "source_node"
	// ExtDestinationNode is the node of the destination address.
	ExtDestinationNode = "destination_node"
)

// maxNodeExtensions bounds the cache of extensions (one per pair of
// nodes seen): the cache starts over when it is full.
const maxNodeExtensions = 4096

// nodeExtensions builds Flow.extensions: a google.protobuf.Struct naming
// the source's and the destination's nodes. Hubble's Endpoint has no node
// field, and a flow's node_name is the node that captured it, not where
// its ends live. One message per pair of nodes is built and shared by the
// flows (flows are immutable once made).
type nodeExtensions struct {
	mu sync.Mutex
	m  map[[2]string]*anypb.Any
}

func (n *nodeExtensions) get(src, dst string) *anypb.Any {
	if src == "" && dst == "" {
		return nil
	}
	k := [2]string{src, dst}
	n.mu.Lock()
	defer n.mu.Unlock()
	if a, ok := n.m[k]; ok {
		return a
	}
	fields := map[string]*structpb.Value{}
	if src != "" {
		fields[ExtSourceNode] = structpb.NewStringValue(src)
	}
	if dst != "" {
		fields[ExtDestinationNode] = structpb.NewStringValue(dst)
	}
	a, err := anypb.New(&structpb.Struct{Fields: fields})
	if err != nil {
		return nil
	}
	if n.m == nil || len(n.m) >= maxNodeExtensions {
		n.m = make(map[[2]string]*anypb.Any)
	}
	n.m[k] = a
	return a
}
