package hostsockets

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/datapath/netns"
	"github.com/cellium/cellium/statedb/lb"
)

// Kernel socket states (include/net/tcp_states.h) the listing keeps.
const (
	stateListen = 10 // TCP_LISTEN: a TCP socket accepting connections
	stateClose  = 7  // TCP_CLOSE: a UDP socket not connected to a peer
)

// dumpAttempts is how often a dump interrupted by a concurrent change of
// the socket tables is tried before its error is returned.
const dumpAttempts = 3

// Socket is a socket that takes traffic to its port.
type Socket struct {
	// Proto is lb.TCP or lb.UDP.
	Proto uint8
	// Addr is the address the socket is bound to (an IPv4-mapped IPv6
	// address unmapped): 0.0.0.0 or :: for every address of the node.
	Addr netip.Addr
	// Port is the local port.
	Port uint16
	// Inode is the socket's inode ("socket:[Inode]" in /proc/<pid>/fd).
	Inode uint32
	// UID is the owner's user ID.
	UID uint32
	// Own says that the calling process holds the socket (one of its file
	// descriptors refers to Inode).
	Own bool
}

// Wildcard reports whether s takes traffic to every address of the node:
// it is bound to 0.0.0.0 or :: (an IPv6 socket without IPV6_V6ONLY, Go's
// default for ":port", takes IPv4 too).
func (s Socket) Wildcard() bool { return s.Addr.IsUnspecified() }

// String is "0.0.0.0:30080/TCP".
func (s Socket) String() string {
	return netip.AddrPortFrom(s.Addr, s.Port).String() + "/" + lb.ProtoName(s.Proto)
}

// Lister lists the listening sockets of one network namespace. Create it
// with Open; Close it.
type Lister struct {
	h       *netlink.Handle
	procDir string
}

// Open returns a Lister of the network namespace at nsPath ("" is the
// calling process's). Its netlink socket is created in that namespace
// and stays bound to it, so that the Lister may be used from any
// goroutine.
func Open(nsPath string) (*Lister, error) {
	var h *netlink.Handle
	err := netns.Do(nsPath, func() error {
		var err error
		h, err = netlink.NewHandle(unix.NETLINK_INET_DIAG)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("open a sock_diag netlink socket: %w", err)
	}
	return &Lister{h: h, procDir: "/proc"}, nil
}

// Close releases the netlink socket.
func (l *Lister) Close() { l.h.Close() }

// Listening returns the TCP sockets in LISTEN and the bound, unconnected
// UDP sockets, IPv4 and IPv6, of the Lister's namespace, each with Own
// set when the calling process holds it. A kernel without udp_diag gives
// the TCP sockets only.
//
// It returns the error of a dump that fails (or is interrupted
// dumpAttempts times in a row by changes of the socket tables).
func (l *Lister) Listening() ([]Socket, error) {
	own, err := OwnInodes(l.procDir)
	if err != nil {
		return nil, err
	}
	var out []Socket
	for _, q := range []struct {
		proto uint8
		state uint8
		dump  func(uint8) ([]*netlink.Socket, error)
	}{
		{lb.TCP, stateListen, l.h.SocketDiagTCP},
		{lb.UDP, stateClose, l.h.SocketDiagUDP},
	} {
		for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
			socks, err := dump(q.dump, family)
			if q.proto == lb.UDP && errors.Is(err, unix.ENOENT) {
				// No udp_diag in the kernel (a module not loaded and
				// not loadable): the UDP sockets cannot be listed, the
				// TCP ones still are.
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("list %s sockets (family %d) with sock_diag: %w", lb.ProtoName(q.proto), family, err)
			}
			for _, s := range socks {
				if s.State != q.state || s.ID.SourcePort == 0 {
					continue
				}
				addr, ok := netip.AddrFromSlice(s.ID.Source)
				if !ok {
					continue
				}
				out = append(out, Socket{Proto: q.proto, Addr: addr.Unmap(), Port: s.ID.SourcePort,
					Inode: s.INode, UID: s.UID, Own: own[s.INode]})
			}
		}
	}
	return out, nil
}

// dump runs f, again when the kernel says the dump was interrupted.
func dump(f func(uint8) ([]*netlink.Socket, error), family uint8) ([]*netlink.Socket, error) {
	var err error
	for range dumpAttempts {
		var socks []*netlink.Socket
		socks, err = f(family)
		if err == nil {
			return socks, nil
		}
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return nil, err
		}
	}
	return nil, err
}

// OwnInodes returns the inodes of the sockets the calling process holds
// (procDir/self/fd, procDir is usually "/proc").
func OwnInodes(procDir string) (map[uint32]bool, error) {
	fds := filepath.Join(procDir, "self", "fd")
	ents, err := os.ReadDir(fds)
	if err != nil {
		return nil, fmt.Errorf("list the agent's file descriptors: %w", err)
	}
	out := map[uint32]bool{}
	for _, e := range ents {
		if ino, ok := socketInode(filepath.Join(fds, e.Name())); ok {
			out[ino] = true
		}
	}
	return out, nil
}

// Process is a process holding a socket.
type Process struct {
	PID  int
	Comm string
}

// String is "nginx (pid 1234)".
func (p Process) String() string { return fmt.Sprintf("%s (pid %d)", p.Comm, p.PID) }

// Processes returns, for each inode of inodes some process visible in
// procDir holds, the first such process found. Processes it may not read
// (another user's, without the privilege) or that end meanwhile are left
// out; so is everything when procDir shows another PID namespace's
// processes (an agent without hostPID).
func Processes(procDir string, inodes []uint32) map[uint32]Process {
	want := map[uint32]bool{}
	for _, i := range inodes {
		want[i] = true
	}
	out := map[uint32]Process{}
	if len(want) == 0 {
		return out
	}
	ents, err := os.ReadDir(procDir)
	if err != nil {
		return out
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		fds := filepath.Join(procDir, e.Name(), "fd")
		fdEnts, err := os.ReadDir(fds)
		if err != nil {
			continue
		}
		for _, fd := range fdEnts {
			ino, ok := socketInode(filepath.Join(fds, fd.Name()))
			if !ok || !want[ino] {
				continue
			}
			if _, seen := out[ino]; seen {
				continue
			}
			comm, err := os.ReadFile(filepath.Join(procDir, e.Name(), "comm"))
			if err != nil {
				continue
			}
			out[ino] = Process{PID: pid, Comm: strings.TrimSpace(string(comm))}
		}
		if len(out) == len(want) {
			break
		}
	}
	return out
}

// socketInode reads the file descriptor link at path: "socket:[N]" is N.
func socketInode(path string) (uint32, bool) {
	target, err := os.Readlink(path)
	if err != nil {
		return 0, false
	}
	s, ok := strings.CutPrefix(target, "socket:[")
	if !ok {
		return 0, false
	}
	s, ok = strings.CutSuffix(s, "]")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, false
	}
	return uint32(n), true
}

// Processes names the processes holding the sockets of inodes (Processes
// in the Lister's /proc).
func (l *Lister) Processes(inodes []uint32) map[uint32]Process { return Processes(l.procDir, inodes) }
