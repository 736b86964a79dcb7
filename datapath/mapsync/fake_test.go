package mapsync

import (
	"errors"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cellium/cellium/statedb/policy"
)

// notifier lets a test wait for the next change of a fake without
// sleeping.
type notifier struct {
	mu sync.Mutex
	ch chan struct{}
}

func (n *notifier) watch() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch == nil {
		n.ch = make(chan struct{})
	}
	return n.ch
}

func (n *notifier) notify() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch != nil {
		close(n.ch)
		n.ch = nil
	}
}

// fakeMap is an in-memory Map with fault injection.
type fakeMap[K, V comparable] struct {
	*notifier
	mu sync.Mutex
	m  map[K]V
	// failUpdates makes the next n Update calls fail (n < 0: all until
	// changed).
	failUpdates int
	// max is the capacity (0: unbounded); an Update that would exceed
	// it fails and writes nothing.
	max int
	// emptied is set when an Update or Delete left a map empty that
	// had entries (a window without policy).
	emptied bool
	updates int
}

var errInjected = errors.New("injected failure")

func newFakeMap[K, V comparable](n *notifier) *fakeMap[K, V] {
	if n == nil {
		n = &notifier{}
	}
	return &fakeMap[K, V]{notifier: n, m: map[K]V{}}
}

func (f *fakeMap[K, V]) Update(keys []K, vals []V) error {
	defer f.notify()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failUpdates != 0 {
		if f.failUpdates > 0 {
			f.failUpdates--
		}
		return errInjected
	}
	if f.max > 0 {
		n := len(f.m)
		for _, k := range keys {
			if _, ok := f.m[k]; !ok {
				n++
			}
		}
		if n > f.max {
			return errors.New("no space left on device")
		}
	}
	f.updates++
	for i, k := range keys {
		f.m[k] = vals[i]
	}
	return nil
}

func (f *fakeMap[K, V]) Delete(keys []K) error {
	defer f.notify()
	f.mu.Lock()
	defer f.mu.Unlock()
	had := len(f.m) > 0
	for _, k := range keys {
		delete(f.m, k)
	}
	if had && len(f.m) == 0 {
		f.emptied = true
	}
	return nil
}

func (f *fakeMap[K, V]) Dump() (map[K]V, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.m), nil
}

// put writes behind the reconciler's back.
func (f *fakeMap[K, V]) put(k K, v V) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.m[k] = v
}

func (f *fakeMap[K, V]) snapshot() map[K]V {
	m, _ := f.Dump()
	return m
}

func (f *fakeMap[K, V]) fail(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failUpdates = n
}

// fakePolicyMaps are in-memory policy maps by endpoint ID.
type fakePolicyMaps struct {
	*notifier
	mu   sync.Mutex
	maps map[uint16]*fakeMap[policy.Key, PolicyValue]
	// max is the capacity of the maps it creates (0: 16384).
	max int
}

func newFakePolicyMaps() *fakePolicyMaps {
	return &fakePolicyMaps{notifier: &notifier{}, maps: map[uint16]*fakeMap[policy.Key, PolicyValue]{}}
}

type fakePolicyMap struct {
	*fakeMap[policy.Key, PolicyValue]
}

func (fakePolicyMap) Close() error { return nil }

func (f fakePolicyMap) MaxEntries() int {
	if f.max > 0 {
		return f.max
	}
	return 16384
}

func (f *fakePolicyMaps) Open(id uint16) (PolicyMap, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.maps[id]
	if !ok {
		m = newFakeMap[policy.Key, PolicyValue](f.notifier)
		m.max = f.max
		f.maps[id] = m
	}
	return fakePolicyMap{m}, nil
}

func (f *fakePolicyMaps) Remove(id uint16) error {
	defer f.notify()
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.maps, id)
	return nil
}

func (f *fakePolicyMaps) List() ([]uint16, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.maps)), nil
}

func (f *fakePolicyMaps) get(id uint16) (*fakeMap[policy.Key, PolicyValue], bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.maps[id]
	return m, ok
}

// waitFor waits until cond holds, re-checking whenever one of the watch
// functions' channels closes.
func waitFor(t testing.TB, what string, cond func() bool, watches ...func() <-chan struct{}) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		chans := make([]<-chan struct{}, len(watches))
		for i, w := range watches {
			chans[i] = w()
		}
		if cond() {
			return
		}
		if !selectAny(chans, timeout) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// selectAny waits for any of up to 3 channels; false on timeout.
func selectAny(chans []<-chan struct{}, timeout <-chan time.Time) bool {
	var c [3]<-chan struct{}
	copy(c[:], chans)
	select {
	case <-c[0]:
	case <-c[1]:
	case <-c[2]:
	case <-timeout:
		return false
	}
	return true
}
