// Package nodeinit holds the steps that prepare a node before the agent
// starts, run by the init containers of the agent's DaemonSet as
// subcommands of cellium-agent (the image has no shell): installing the
// CNI plugin into the node's CNI binary directory, mounting the BPF
// filesystem on the host if it is not mounted yet, and mounting the host's
// cgroup v2 hierarchy for the socket load balancer.
package nodeinit

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/statedir"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/datapath/socklb"
)

// InstallCNIPlugin copies the file src into dir under the same base name,
// atomically with statedir.WriteFile (a temporary file in dir, synced,
// made executable and renamed over the old one), so that the container
// runtime never runs half a plugin. A regular file there with the same content and
// mode 0755 is left alone (installed false): a plugin the runtime may be
// running is not replaced for nothing. dir is created if missing.
//
// Errors: src cannot be read; dir cannot be written.
func InstallCNIPlugin(src, dir string) (dst string, installed bool, err error) {
	data, err := os.ReadFile(src)
	if err != nil {
		return "", false, fmt.Errorf("install CNI plugin: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", false, fmt.Errorf("install CNI plugin: %w", err)
	}
	dst = filepath.Join(dir, filepath.Base(src))
	if sameFile(dst, data) {
		return dst, false, nil
	}
	if err := statedir.WriteFile(dst, data, 0o755); err != nil {
		return "", false, fmt.Errorf("install CNI plugin %s into %s: %w", src, dir, err)
	}
	return dst, true, nil
}

// sameFile reports whether path is a regular file (not a symbolic link)
// with mode 0755 holding data.
func sameFile(path string, data []byte) bool {
	st, err := os.Lstat(path)
	if err != nil || !st.Mode().IsRegular() || st.Mode().Perm() != 0o755 || st.Size() != int64(len(data)) {
		return false
	}
	have, err := os.ReadFile(path)
	return err == nil && bytes.Equal(have, data)
}

// MountBPFFS makes path a directory on a bpf filesystem, mounting one
// there unless it already lies on one (maps.EnsureBPFFS). Run in a
// container whose mount of path propagates back to the host
// (Bidirectional), the mount outlives the container: the agent's pinned
// maps then survive its restarts.
func MountBPFFS(path string) error { return maps.EnsureBPFFS(path) }

// MountCgroup2 makes path a mount of the root of the host's cgroup v2
// hierarchy (socklb.EnsureCgroup2) and reports whether it mounted. A
// container may have a cgroup namespace of its own, whose cgroup2 mount
// would show only the container's subtree, not the root the socket load
// balancer attaches to; with hostProc (the host's /proc, mounted into the
// container) it first enters the cgroup namespace of the host's init
// process. Where that namespace cannot be opened (a host that hides its
// init's namespaces) it stays in its own, which is right for a container
// in the host's cgroup namespace (the default on cgroup v1 hosts), and
// checks: a mount whose root is not the hierarchy's root is undone and is
// an error. The namespace is entered on a thread of its own that is thrown
// away afterwards; the mount is made in the container's mount namespace,
// so path must be a volume whose mounts propagate to the host
// (Bidirectional).
//
// Errors: the host's cgroup namespace cannot be entered (not privileged);
// the mount fails; the mount is a subtree.
func MountCgroup2(path, hostProc string) (mounted bool, err error) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Never unlocked: the thread leaves with the goroutine, so no
		// other goroutine runs in the host's cgroup namespace.
		runtime.LockOSThread()
		if hostProc != "" {
			if err = enterCgroupNS(filepath.Join(hostProc, "1", "ns", "cgroup")); err != nil {
				return
			}
		}
		if mounted, err = socklb.EnsureCgroup2(path); err != nil || !mounted {
			return
		}
		// The root cgroup alone has no cgroup.type.
		if _, serr := os.Stat(filepath.Join(path, "cgroup.type")); serr == nil {
			uerr := unix.Unmount(path, unix.MNT_DETACH)
			mounted, err = false, errors.Join(fmt.Errorf("cgroup2 mounted at %s is a cgroup namespace's subtree, not the host's root: "+
				"run the container in the host's cgroup namespace or mount the host's /proc at --host-proc", path), uerr)
		}
	}()
	<-done
	return mounted, err
}

// enterCgroupNS moves the calling thread into the cgroup namespace at ns;
// one it is not allowed to open is passed over (nil).
func enterCgroupNS(ns string) error {
	fd, err := unix.Open(ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM):
		return nil
	case err != nil:
		return fmt.Errorf("open the host's cgroup namespace %s (is the host's /proc mounted there?): %w", ns, err)
	}
	defer unix.Close(fd)
	if err := unix.Setns(fd, unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("enter the host's cgroup namespace (the container must be privileged): %w", err)
	}
	return nil
}

// Commands are the subcommands of cellium-agent for the init containers:
// install-cni-plugin, mount-bpffs and mount-cgroup.
func Commands() []*cobra.Command {
	var from []string
	var to string
	install := &cobra.Command{
		Use:   "install-cni-plugin",
		Short: "Copy the CNI plugins into the node's CNI binary directory (atomically, unless unchanged) and exit",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, src := range from {
				dst, installed, err := InstallCNIPlugin(src, to)
				if err != nil {
					return err
				}
				if installed {
					fmt.Fprintf(cmd.OutOrStdout(), "installed %s\n", dst)
				} else {
					fmt.Fprintf(cmd.OutOrStdout(), "%s is up to date\n", dst)
				}
			}
			return nil
		},
	}
	install.Flags().StringArrayVar(&from, "from", []string{"/usr/bin/cellium-cni"}, "a CNI plugin to install (repeat for several)")
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

	var cgPath, hostProc string
	cgroup := &cobra.Command{
		Use:   "mount-cgroup",
		Short: "Mount the host's cgroup v2 hierarchy at --path unless it is mounted there already, and exit",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			mounted, err := MountCgroup2(cgPath, hostProc)
			if err != nil {
				return err
			}
			what := "already mounted"
			if mounted {
				what = "mounted"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "cgroup2 at %s: %s\n", cgPath, what)
			return nil
		},
	}
	cgroup.Flags().StringVar(&cgPath, "path", "/run/cellium/cgroupv2", "where the host's cgroup v2 hierarchy is mounted (the agent's --cgroup-root)")
	cgroup.Flags().StringVar(&hostProc, "host-proc", "/hostproc", "the host's /proc inside the container, to enter the host's cgroup namespace; empty: stay in the current one")
	return []*cobra.Command{install, mount, cgroup}
}
