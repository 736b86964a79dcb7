package endpointpolicy

import (
	"cmp"
	"maps"
	"slices"
	"sync"

	"github.com/cellium/cellium/cells/policy"
)

// rejections are the policies the controller refused, for the API. Safe
// for concurrent use.
type rejections struct {
	mu sync.Mutex
	m  map[policy.Source]string
}

func newRejections() *rejections { return &rejections{m: map[policy.Source]string{}} }

// set records why src was refused; clear forgets it (accepted or deleted).
func (r *rejections) set(src policy.Source, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m[src] = err.Error()
}

func (r *rejections) clear(src policy.Source) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.m, src)
}

// list returns the refused policies sorted by source.
func (r *rejections) list() []policy.RejectedPolicy {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]policy.RejectedPolicy, 0, len(r.m))
	for _, src := range slices.SortedFunc(maps.Keys(r.m), func(a, b policy.Source) int { return cmp.Compare(a.String(), b.String()) }) {
		out = append(out, policy.RejectedPolicy{Source: src, Error: r.m[src]})
	}
	return out
}
