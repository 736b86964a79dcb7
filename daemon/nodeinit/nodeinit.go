// Package nodeinit holds the steps that prepare a node before the agent
// starts, run by the init containers of the agent's DaemonSet as
// subcommands of cellium-agent (the image has no shell): installing the
// CNI plugin into the node's CNI binary directory, and mounting the BPF
// filesystem on the host if it is not mounted yet.
package nodeinit

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/cellium/cellium/datapath/maps"
)

// InstallCNIPlugin copies the file src into dir under the same base name,
// atomically: it is written to a temporary file in dir, synced, made
// executable and renamed over the old one, so that the container runtime
// never runs half a plugin. dir is created if missing.
//
// Errors: src cannot be read; dir cannot be written.
func InstallCNIPlugin(src, dir string) (string, error) {
	in, err := os.Open(src)
	if err != nil {
		return "", fmt.Errorf("install CNI plugin: %w", err)
	}
	defer in.Close()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("install CNI plugin: %w", err)
	}
	dst := filepath.Join(dir, filepath.Base(src))
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(src)+".tmp-")
	if err != nil {
		return "", fmt.Errorf("install CNI plugin: %w", err)
	}
	_, err = io.Copy(tmp, in)
	if err == nil {
		err = tmp.Chmod(0o755)
	}
	if err == nil {
		err = tmp.Sync()
	}
	err = errors.Join(err, tmp.Close())
	if err == nil {
		err = os.Rename(tmp.Name(), dst)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return "", fmt.Errorf("install CNI plugin %s into %s: %w", src, dir, err)
	}
	return dst, nil
}

// MountBPFFS makes path a directory on a bpf filesystem, mounting one
// there unless it already lies on one (maps.EnsureBPFFS). Run in a
// container whose mount of path propagates back to the host
// (Bidirectional), the mount outlives the container: the agent's pinned
// maps then survive its restarts.
func MountBPFFS(path string) error { return maps.EnsureBPFFS(path) }

// Commands are the subcommands of cellium-agent for the init containers:
// install-cni-plugin and mount-bpffs.
func Commands() []*cobra.Command {
	var from, to string
	install := &cobra.Command{
		Use:   "install-cni-plugin",
		Short: "Copy the CNI plugin into the node's CNI binary directory (atomically) and exit",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dst, err := InstallCNIPlugin(from, to)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "installed %s\n", dst)
			return nil
		},
	}
	install.Flags().StringVar(&from, "from", "/usr/bin/cellium-cni", "the CNI plugin to install")
	install.Flags().StringVar(&to, "to-dir", "/host/opt/cni/bin", "the node's CNI binary directory (mounted from the host)")

	var path string
	mount := &cobra.Command{
		Use:   "mount-bpffs",
		Short: "Mount the BPF filesystem at --path unless it is mounted there already, and exit",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := MountBPFFS(path); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "bpffs at %s\n", path)
			return nil
		},
	}
	mount.Flags().StringVar(&path, "path", "/sys/fs/bpf", "where the BPF filesystem is mounted")
	return []*cobra.Command{install, mount}
}
