package ipam

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"

	"github.com/cellium/cellium/cells/statedir"
)

// stateVersion is the version of the state file format.
const stateVersion = 1

// stateFile is the JSON content of StateFileName.
type stateFile struct {
	// Version is stateVersion.
	Version int `json:"version"`
	// Node is the node the allocations belong to.
	Node string `json:"node"`
	// BootID is the boot ID of the kernel when the file was written.
	BootID string `json:"boot-id,omitempty"`
	// CIDRs are the pod CIDRs the addresses came from.
	CIDRs []netip.Prefix `json:"cidrs,omitempty"`
	// Allocations are every allocated address but the router's, by
	// address.
	Allocations []stateEntry `json:"allocations"`
}

// stateEntry is one allocation in the state file.
type stateEntry struct {
	IP    netip.Addr `json:"ip"`
	Owner string     `json:"owner"`
	// ContainerID is the CNI container ID the address was allocated for
	// (absent in files of older agents).
	ContainerID string `json:"container-id,omitempty"`
}

// stateStore writes the state file atomically (statedir.WriteFile) and coalesces concurrent writes: a caller waits for one write
// that started after its change, and many changes share one write.
type stateStore struct {
	path   string
	bootID string

	mu       sync.Mutex
	cond     *sync.Cond
	gen      uint64 // changes requested so far
	written  uint64 // every change up to this one is on disk
	failed   uint64 // the last failed write covered changes up to this one
	failErr  error
	inFlight bool
}

func newStateStore(path, bootID string) *stateStore {
	s := &stateStore{path: path, bootID: bootID}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// load reads the state file; nil, nil when there is none.
//
// Possible errors: the file cannot be read or is not a state file of this
// version; the message says how to start over.
func (s *stateStore) load() (*stateFile, error) {
	data, err := os.ReadFile(s.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read IPAM state: %w", err)
	}
	var st stateFile
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("IPAM state file %s is corrupt: %w; move it away to start without the saved allocations (running pods may then get duplicate addresses)", s.path, err)
	}
	if st.Version != stateVersion {
		return nil, fmt.Errorf("IPAM state file %s has version %d, this agent reads version %d; move it away to start without the saved allocations", s.path, st.Version, stateVersion)
	}
	return &st, nil
}

// commit records a change and returns once a write of a snapshot taken
// after it has finished. snapshot must include every change committed
// before it is called.
func (s *stateStore) commit(snapshot func() *stateFile) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen++
	mine := s.gen
	for {
		switch {
		case s.written >= mine:
			return nil
		case s.failed >= mine:
			return s.failErr
		case s.inFlight:
			s.cond.Wait()
			continue
		}
		s.inFlight = true
		upTo := s.gen
		s.mu.Unlock()
		st := snapshot()
		st.BootID = s.bootID
		err := s.write(st)
		s.mu.Lock()
		s.inFlight = false
		if err != nil {
			s.failed, s.failErr = upTo, err
		} else {
			s.written = upTo
		}
		s.cond.Broadcast()
	}
}

// write replaces the state file with st atomically (statedir.WriteFile:
// temporary file, fsync, rename, fsync of the directory).
func (s *stateStore) write(st *stateFile) error {
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("encode IPAM state: %w", err)
	}
	if err := statedir.WriteFile(s.path, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("write IPAM state (--state-dir): %w", err)
	}
	return nil
}
