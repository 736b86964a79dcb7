package devkubelet

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// SandboxState is how far a sandbox got.
type SandboxState string

const (
	// SandboxCreating is recorded before the network namespace is made
	// and kept until CNI ADD succeeded. A sandbox found in this state
	// after a restart is torn down and made again.
	SandboxCreating SandboxState = "creating"
	// SandboxReady means CNI ADD succeeded.
	SandboxReady SandboxState = "ready"
)

// Sandbox is one pod sandbox the kubelet made: a network namespace
// attached to the CNI network under a sandbox (infra container) ID. It is
// recorded in StateDir/sandboxes/ID.json before anything is made, so that
// a restarted kubelet finds, adopts or removes everything it made.
type Sandbox struct {
	// ID is the sandbox ID: CNI_CONTAINERID and K8S_POD_INFRA_CONTAINER_ID.
	ID string `json:"id"`
	// Namespace, Name and UID are the pod's.
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	UID       types.UID `json:"uid"`
	// NetnsPath is the pod's network namespace (CNI_NETNS).
	NetnsPath string `json:"netns"`
	// IfName is the pod's interface (CNI_IFNAME).
	IfName string `json:"ifName"`
	// State is SandboxCreating until CNI ADD succeeded.
	State SandboxState `json:"state"`
	// ConfList is the CNI network configuration ADD used; DEL uses it
	// too, so a sandbox can be torn down after the conflist is gone.
	ConfList json.RawMessage `json:"confList,omitempty"`
	// IP is the pod's address from the CNI result.
	IP string `json:"ip,omitempty"`
	// HostInterfaces are the interfaces of the CNI result that are not in
	// the pod (the host side of the veth).
	HostInterfaces []string `json:"hostInterfaces,omitempty"`
	// Created is when the sandbox was recorded.
	Created time.Time `json:"created"`
}

// Key is the pod's "namespace/name".
func (s *Sandbox) Key() string { return s.Namespace + "/" + s.Name }

// NetnsName is the name of the sandbox's network namespace for
// `ip netns exec`.
func (s *Sandbox) NetnsName() string { return filepath.Base(s.NetnsPath) }

// maxSandboxIDPrefix bounds Config.SandboxIDPrefix: the rest of the ID
// stays random.
const maxSandboxIDPrefix = 16

// newSandboxID returns a random 64-hex-digit ID, the form container
// runtimes use, that starts with prefix (hexadecimal digits).
func newSandboxID(prefix string) string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)[len(prefix):]
}

// maxNetnsName bounds netns names, so that they stay readable in
// `ip netns list`.
const maxNetnsName = 63

// netnsName names the network namespace of a pod's sandbox:
// cellium-<namespace>-<pod>-<first 8 digits of the sandbox ID>, with the
// namespace and pod part shortened to keep the name at most 63 bytes.
func netnsName(namespace, name, sandboxID string) string {
	mid := namespace + "-" + name
	const fixed = len("cellium-") + 1 + 8
	if len(mid) > maxNetnsName-fixed {
		mid = strings.TrimRight(mid[:maxNetnsName-fixed], "-.")
	}
	return "cellium-" + mid + "-" + sandboxID[:8]
}

// sandboxStore keeps the sandbox records in a directory.
type sandboxStore struct{ dir string }

func (s sandboxStore) path(id string) string { return filepath.Join(s.dir, id+".json") }

// save writes a record atomically.
func (s sandboxStore) save(sb *Sandbox) error {
	data, err := json.Marshal(sb)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(s.dir, ".sandbox-*")
	if err != nil {
		return fmt.Errorf("record sandbox %s: %w", sb.ID, err)
	}
	_, werr := tmp.Write(append(data, '\n'))
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("record sandbox %s: %w", sb.ID, err)
	}
	if err := os.Rename(tmp.Name(), s.path(sb.ID)); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("record sandbox %s: %w", sb.ID, err)
	}
	return nil
}

// remove deletes a record; a missing one is fine.
func (s sandboxStore) remove(id string) error {
	if err := os.Remove(s.path(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove sandbox record %s: %w", id, err)
	}
	return nil
}

// load reads every record. A record that cannot be read is an error: its
// sandbox would be leaked otherwise.
func (s sandboxStore) load() ([]*Sandbox, error) {
	entries, err := os.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read sandbox records: %w", err)
	}
	var out []*Sandbox
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".json") || strings.HasPrefix(name, ".") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(s.dir, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed meanwhile by a running kubelet
		}
		if err != nil {
			return nil, fmt.Errorf("read sandbox record: %w", err)
		}
		var sb Sandbox
		if err := json.Unmarshal(data, &sb); err != nil || sb.ID == "" || sb.ID+".json" != name {
			return nil, fmt.Errorf("sandbox record %s is corrupt (%v): remove its network namespace by hand and delete the file", filepath.Join(s.dir, name), err)
		}
		out = append(out, &sb)
	}
	return out, nil
}

// shortID is the first 12 digits of a sandbox ID, for messages.
func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// LoadSandboxes returns the sandboxes recorded in a kubelet's state
// directory (Config.StateDir), e.g. of a devkubelet running as another
// process.
func LoadSandboxes(stateDir string) ([]Sandbox, error) {
	records, err := sandboxStore{dir: filepath.Join(stateDir, "sandboxes")}.load()
	if err != nil {
		return nil, err
	}
	out := make([]Sandbox, 0, len(records))
	for _, sb := range records {
		out = append(out, *sb)
	}
	return out, nil
}
