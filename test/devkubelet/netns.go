package devkubelet

import (
	"path/filepath"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/cellium/cellium/datapath/netns"
)

// DefaultNetnsDir is where `ip netns` keeps named network namespaces; the
// kubelet puts its pods' namespaces there so that `ip netns exec NAME ...`
// works on them.
const DefaultNetnsDir = "/var/run/netns"

// createNetns creates a network namespace and pins it at dir/name, the way
// `ip netns add` does, then brings its loopback up (as a container
// runtime's loopback plugin would). It returns the path. An existing file
// at that path is an error.
func createNetns(dir, name string) (string, error) {
	if err := netns.EnsureSharedDir(dir); err != nil {
		return "", err
	}
	path := filepath.Join(dir, name)
	if err := netns.Create(path); err != nil {
		return "", err
	}
	return path, nil
}

// removeNetns unpins and removes the namespace at path (`ip netns del`).
// The namespace itself goes away when nothing else holds it. A missing
// path is not an error.
func removeNetns(path string) error { return netns.Remove(path) }

// netnsExists reports whether path is a pinned network namespace.
func netnsExists(path string) bool {
	n, err := ns.GetNS(path)
	if err != nil {
		return false
	}
	_ = n.Close()
	return true
}

// CreateNodeNetns creates a network namespace pinned at
// DefaultNetnsDir/name with its loopback up, to serve as a node's own
// namespace (Config.PluginNetns), and returns its path. Remove it with
// RemoveNodeNetns.
func CreateNodeNetns(name string) (string, error) {
	return createNetns(DefaultNetnsDir, name)
}

// RemoveNodeNetns removes a namespace made by CreateNodeNetns, with the
// links in it; a missing one is not an error.
func RemoveNodeNetns(path string) error {
	return removeNetns(path)
}
