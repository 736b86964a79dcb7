package realnode

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// kubeletSysctlsDir is where the real nodes of this machine share the
// sysctls their kubelets change. Those sysctls (kernel.panic,
// vm.overcommit_memory, ...) belong to the whole machine, not to a network
// or mount namespace, so nodes of test packages that go test runs side by
// side, and a detached `make up`, all change the same values: what one node
// read at its start may be another node's kubelet's setting.
const kubeletSysctlsDir = "/run/cellium-test/kubelet-sysctls"

// sysctlShare keeps the machine's values of a set of sysctls from before
// the first holder, and gives them back when the last holder is gone.
// Each holder is a file in dir/holders naming the process that registered
// it and the node's cgroup root: the holder lives while either does (the
// process until the kubelet runs, the cgroup root while the node's
// processes do, also after a detached `make up` returned), so a holder
// SIGKILLed before its node started counts as gone. dir/saved.json holds
// the values from before; dir/lock, a flock, orders the holders' changes.
type sysctlShare struct {
	dir   string
	names []string
	// read returns the current values of the names that exist; write sets
	// values (only those that differ).
	read  func(names []string) (map[string]string, error)
	write func(values map[string]string) error
	// cgroupExists reports whether a node's cgroup root is still there.
	cgroupExists func(root string) bool
}

// machineKubeletSysctls is the share of [KubeletSysctls] on this machine.
func machineKubeletSysctls() sysctlShare {
	return sysctlShare{
		dir:          kubeletSysctlsDir,
		names:        KubeletSysctls,
		read:         readSysctls,
		write:        writeSysctls,
		cgroupExists: func(root string) bool { return len(cgroupRootExists(root)) > 0 },
	}
}

// sysctlHolder is a holder's file.
type sysctlHolder struct {
	PID        int    `json:"pid"`
	PIDStart   string `json:"pidStart"` // the process's start time, against pid reuse
	CgroupRoot string `json:"cgroupRoot"`
}

// hold registers name (a node's cgroup root names it) and returns the
// values from before the first live holder: the ones the last holder
// restores. The first holder saves the current values.
func (s sysctlShare) hold(name, cgroupRoot string) (map[string]string, error) {
	var before map[string]string
	err := s.locked(func() error {
		live, err := s.liveHolders("")
		if err != nil {
			return err
		}
		before, err = s.saved()
		if err != nil {
			return err
		}
		if before == nil || len(live) == 0 {
			// No node holds the values now. A saved set without a live
			// holder is from a run killed before it restored: those values
			// are the machine's, the current ones may be a kubelet's.
			if before == nil {
				if before, err = s.read(s.names); err != nil {
					return err
				}
			}
			if err := writeJSON(filepath.Join(s.dir, "saved.json"), before); err != nil {
				return err
			}
		}
		self := os.Getpid()
		return writeJSON(s.holderPath(name), sysctlHolder{PID: self, PIDStart: processStart(self), CgroupRoot: cgroupRoot})
	})
	if err != nil {
		return nil, fmt.Errorf("hold the kubelet's sysctls: %w", err)
	}
	return before, nil
}

// release removes name's holder; when no live holder is left, the saved
// values are written back and forgotten. fallback (what the node read at
// its start, from a state file written before holders existed) is
// restored when nothing was saved.
func (s sysctlShare) release(name string, fallback map[string]string) error {
	err := s.locked(func() error {
		if err := os.Remove(s.holderPath(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		live, err := s.liveHolders("")
		if err != nil || len(live) > 0 {
			return err
		}
		saved, err := s.saved()
		if err != nil {
			return err
		}
		if saved == nil {
			saved = fallback
		}
		if err := s.write(saved); err != nil {
			return err
		}
		if err := os.Remove(filepath.Join(s.dir, "saved.json")); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("release the kubelet's sysctls: %w", err)
	}
	return nil
}

// others returns the live holders other than name: while there are any,
// the sysctls are theirs to set, and not a leftover of name's node.
func (s sysctlShare) others(name string) ([]string, error) {
	var out []string
	err := s.locked(func() error {
		var err error
		out, err = s.liveHolders(name)
		return err
	})
	return out, err
}

// liveHolders lists the holders still alive, except skip, and removes
// the files of those that are gone.
func (s sysctlShare) liveHolders(skip string) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(s.dir, "holders"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var live []string
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || (skip != "" && name == holderFileName(skip)) {
			continue
		}
		var h sysctlHolder
		b, err := os.ReadFile(filepath.Join(s.dir, "holders", e.Name()))
		if err == nil {
			err = json.Unmarshal(b, &h)
		}
		alive := err == nil && (processAlive(h.PID, h.PIDStart) || (h.CgroupRoot != "" && s.cgroupExists(h.CgroupRoot)))
		if !alive {
			// Gone (or unreadable: a holder killed while writing it).
			if err := os.Remove(filepath.Join(s.dir, "holders", e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				return nil, err
			}
			continue
		}
		live = append(live, name)
	}
	return live, nil
}

// saved returns the values saved by the first holder, nil if none.
func (s sysctlShare) saved() (map[string]string, error) {
	b, err := os.ReadFile(filepath.Join(s.dir, "saved.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var v map[string]string
	if err := json.Unmarshal(b, &v); err != nil {
		// A file cut short by a kill: nothing usable was saved.
		return nil, nil
	}
	return v, nil
}

func (s sysctlShare) holderPath(name string) string {
	return filepath.Join(s.dir, "holders", holderFileName(name)+".json")
}

// holderFileName is name (a cgroup root, "/cellium-rn-10-250-0-1") as a
// file name.
func holderFileName(name string) string {
	return strings.ReplaceAll(strings.Trim(name, "/"), "/", "_")
}

// locked runs f with the share's flock held (blocking: the holders keep it
// for a few file operations only).
func (s sysctlShare) locked(f func() error) error {
	if err := os.MkdirAll(filepath.Join(s.dir, "holders"), 0o755); err != nil {
		return err
	}
	lf, err := os.OpenFile(filepath.Join(s.dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lf.Close()
	for {
		err = syscall.Flock(int(lf.Fd()), syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("lock %s: %w", lf.Name(), err)
	}
	return f()
}

// writeJSON writes v to path through a temporary file and a rename, so a
// kill never leaves half a file.
func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// processStart returns pid's start time (field 22 of /proc/pid/stat), ""
// if pid is gone.
func processStart(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	// The command (field 2) is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return ""
	}
	fields := strings.Fields(string(b[i+1:]))
	// fields[0] is field 3 (state): field 22 is fields[19].
	if len(fields) < 20 {
		return ""
	}
	return fields[19]
}

// processAlive reports whether pid runs and is the process that started at
// start (not another that reused its pid).
func processAlive(pid int, start string) bool {
	if pid <= 0 {
		return false
	}
	now := processStart(pid)
	return now != "" && now == start
}
