package endpointmanager

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cellium/cellium/cells/statedir"
	"github.com/cellium/cellium/statedb/endpoints"
)

// store persists endpoints as one JSON file per endpoint ID in a
// directory, each written atomically and durably (statedir.WriteFile).
type store struct {
	dir string
	now func() time.Time
}

const (
	stateSuffix = ".json"
	// corruptInfix marks a quarantined state file:
	// <id>.json.corrupt-<UTC time>.
	corruptInfix = ".corrupt-"
)

func (s store) path(id uint16) string {
	return filepath.Join(s.dir, strconv.Itoa(int(id))+stateSuffix)
}

// save writes the endpoint's state.
func (s store) save(ep *endpoints.Endpoint) error {
	data, err := json.MarshalIndent(ep, "", "  ")
	if err != nil {
		return fmt.Errorf("encode endpoint %d: %w", ep.ID, err)
	}
	if err := statedir.WriteFile(s.path(ep.ID), data, 0o600); err != nil {
		return fmt.Errorf("save endpoint %d: %w", ep.ID, err)
	}
	return nil
}

// remove deletes the endpoint's state; a missing file is fine.
func (s store) remove(id uint16) error {
	if err := os.Remove(s.path(id)); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("remove state of endpoint %d: %w", id, err)
	}
	if err := statedir.SyncDir(s.dir); err != nil {
		return fmt.Errorf("remove state of endpoint %d: %w", id, err)
	}
	return nil
}

// quarantined is a state file that could not be read, renamed out of the
// way and kept for inspection.
type quarantined struct {
	// ID is the endpoint ID from the file name (0 if the name holds none).
	ID uint16
	// File is the original path; Moved where it is now ("" if the rename
	// failed too).
	File, Moved string
	// Err says what was wrong with it.
	Err error
}

// load reads every saved endpoint. A file that cannot be read or decoded
// is renamed to <name>.corrupt-<time> (kept, never deleted) and returned
// in bad, so that the caller can keep its endpoint ID and say what
// happened. Leftover temporary files of an interrupted save are removed.
//
// Possible errors: the directory cannot be read.
func (s store) load() (good []*endpoints.Endpoint, bad []quarantined, err error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil, nil
		}
		return nil, nil, fmt.Errorf("read endpoint state directory: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		if statedir.IsTemp(name) || strings.HasPrefix(name, ".tmp-") {
			_ = os.Remove(filepath.Join(s.dir, name)) // an interrupted save
			continue
		}
		if id, ok := quarantinedID(name); ok {
			// Moved aside by an earlier start and not yet dealt with: its
			// endpoint ID stays reserved.
			bad = append(bad, quarantined{ID: id, Moved: filepath.Join(s.dir, name),
				Err: errors.New("quarantined by an earlier start")})
			continue
		}
		if !strings.HasSuffix(name, stateSuffix) {
			continue
		}
		ep, err := s.read(name)
		if err != nil {
			bad = append(bad, s.quarantine(name, err))
			continue
		}
		good = append(good, ep)
	}
	return good, bad, nil
}

// read decodes one state file and checks it names its own ID.
func (s store) read(name string) (*endpoints.Endpoint, error) {
	data, err := os.ReadFile(filepath.Join(s.dir, name))
	if err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	var ep endpoints.Endpoint
	if err := json.Unmarshal(data, &ep); err != nil {
		return nil, fmt.Errorf("decode (%d bytes): %w", len(data), err)
	}
	if ep.ID == 0 || name != strconv.Itoa(int(ep.ID))+stateSuffix {
		return nil, fmt.Errorf("endpoint ID %d does not match the file name", ep.ID)
	}
	return &ep, nil
}

// quarantinedID parses the ID of a quarantined file's name.
func quarantinedID(name string) (uint16, bool) {
	base, _, ok := strings.Cut(name, stateSuffix+corruptInfix)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(base, 10, 16)
	if err != nil || n == 0 || n > MaxEndpointID {
		return 0, false
	}
	return uint16(n), true
}

// quarantine renames a bad state file to <name>.corrupt-<time>.
func (s store) quarantine(name string, why error) quarantined {
	q := quarantined{File: filepath.Join(s.dir, name), Err: why}
	if n, err := strconv.ParseUint(strings.TrimSuffix(name, stateSuffix), 10, 16); err == nil && n > 0 && n <= MaxEndpointID {
		q.ID = uint16(n)
	}
	moved := q.File + corruptInfix + s.now().UTC().Format("20060102T150405Z")
	if err := os.Rename(q.File, moved); err != nil {
		q.Err = fmt.Errorf("%w (and it could not be moved aside: %v)", why, err)
		return q
	}
	_ = statedir.SyncDir(s.dir)
	q.Moved = moved
	return q
}
