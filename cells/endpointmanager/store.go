package endpointmanager

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cellium/cellium/statedb/endpoints"
)

// store persists endpoints as one JSON file per endpoint ID in a
// directory, written atomically (temporary file, then rename).
type store struct{ dir string }

const stateSuffix = ".json"

func (s store) path(id uint16) string {
	return filepath.Join(s.dir, strconv.Itoa(int(id))+stateSuffix)
}

// save writes the endpoint's state.
func (s store) save(ep *endpoints.Endpoint) error {
	data, err := json.MarshalIndent(ep, "", "  ")
	if err != nil {
		return fmt.Errorf("encode endpoint %d: %w", ep.ID, err)
	}
	tmp, err := os.CreateTemp(s.dir, ".tmp-")
	if err != nil {
		return fmt.Errorf("save endpoint %d: %w", ep.ID, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("save endpoint %d: %w", ep.ID, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("save endpoint %d: %w", ep.ID, err)
	}
	if err := os.Rename(tmp.Name(), s.path(ep.ID)); err != nil {
		return fmt.Errorf("save endpoint %d: %w", ep.ID, err)
	}
	return nil
}

// remove deletes the endpoint's state; a missing file is fine.
func (s store) remove(id uint16) error {
	if err := os.Remove(s.path(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove state of endpoint %d: %w", id, err)
	}
	return nil
}

// load reads every saved endpoint. Unreadable files are returned as
// errors next to the endpoints that could be read, and left in place.
func (s store) load() ([]*endpoints.Endpoint, []error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, []error{fmt.Errorf("read endpoint state directory: %w", err)}
	}
	var (
		out  []*endpoints.Endpoint
		errs []error
	)
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".tmp-") {
			_ = os.Remove(filepath.Join(s.dir, name)) // an interrupted save
			continue
		}
		if !strings.HasSuffix(name, stateSuffix) {
			continue
		}
		data, err := os.ReadFile(filepath.Join(s.dir, name))
		if err != nil {
			errs = append(errs, fmt.Errorf("read %s: %w", name, err))
			continue
		}
		var ep endpoints.Endpoint
		if err := json.Unmarshal(data, &ep); err != nil {
			errs = append(errs, fmt.Errorf("decode %s: %w", name, err))
			continue
		}
		if ep.ID == 0 || name != strconv.Itoa(int(ep.ID))+stateSuffix {
			errs = append(errs, fmt.Errorf("%s: endpoint ID %d does not match the file name", name, ep.ID))
			continue
		}
		out = append(out, &ep)
	}
	return out, errs
}
