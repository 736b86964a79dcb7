package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/maps"
)

// OverlayDir is the directory of the tunnel device's pinned links,
// <root>/cellium/overlay.
func (l Layout) OverlayDir() string { return filepath.Join(l.Dir(), "overlay") }

// overlayHooks are the tunnel device's programs and their tcx hooks.
var overlayHooks = []struct {
	prog string
	tcx  ebpf.AttachType
}{
	{bpf.OverlayProgCilFromOverlay, ebpf.AttachTCXIngress},
	{bpf.OverlayProgCilToOverlay, ebpf.AttachTCXEgress},
}

// Overlay attaches cil_from_overlay and cil_to_overlay (bpf/overlay.c) to
// the tunnel device with tcx, loaded against the global maps pinned in
// Layout.Dir(); the links are pinned in Layout.OverlayDir(), so they keep
// running across an agent restart, and a new agent replaces their
// programs in place.
type Overlay struct {
	Layout Layout
	Netns  Netns
	// Trace emits trace events of the packets the programs pass, as
	// Monitor's aggregation allows.
	Trace bool
	// Monitor is the monitor aggregation (the zero value: none).
	Monitor bpf.Monitor
	// ViaStack hands decapsulated packets for local endpoints to the
	// host stack (DELIVER_VIA_STACK): kube-proxy translates the pods'
	// Service connections there (the socket load balancer is off).
	ViaStack bool

	mu     sync.Mutex
	loaded bool // this process has attached its own programs
	ifidx  int
}

// Ensure attaches the programs to device unless this process already did
// and the links are still on device (it was not re-created). A missing
// device is an error wrapping os.ErrNotExist.
func (o *Overlay) Ensure(device string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.Netns.do(func(h *netlink.Handle) error {
		l, err := linkByName(h, device)
		if err != nil {
			return err
		}
		if l == nil {
			return fmt.Errorf("tunnel device %s: %w", device, os.ErrNotExist)
		}
		ifindex := l.Attrs().Index
		if o.loaded && o.ifidx == ifindex && o.intact(ifindex) {
			return nil
		}
		coll, err := o.load()
		if err != nil {
			return err
		}
		defer coll.Close()
		if err := os.MkdirAll(o.Layout.OverlayDir(), 0o700); err != nil {
			return fmt.Errorf("create %s: %w", o.Layout.OverlayDir(), err)
		}
		for _, hk := range overlayHooks {
			if err := attachPinned(filepath.Join(o.Layout.OverlayDir(), hk.prog), ifindex, hk.tcx, coll.Programs[hk.prog]); err != nil {
				return fmt.Errorf("tunnel device %s: %w", device, err)
			}
		}
		o.loaded, o.ifidx = true, ifindex
		return nil
	})
}

func (o *Overlay) intact(ifindex int) bool {
	for _, hk := range overlayHooks {
		l, err := link.LoadPinnedLink(filepath.Join(o.Layout.OverlayDir(), hk.prog), nil)
		if err != nil {
			return false
		}
		on := linkOn(l, ifindex, hk.tcx)
		l.Close()
		if !on {
			return false
		}
	}
	return true
}

func (o *Overlay) load() (*ebpf.Collection, error) {
	m, err := maps.Open(o.Layout.Dir())
	if err != nil {
		return nil, err
	}
	defer m.Close()
	spec, err := maps.LoadOverlaySpec()
	if err != nil {
		return nil, err
	}
	if err := o.Monitor.ApplyOverlay(spec, o.Trace); err != nil {
		return nil, fmt.Errorf("%w: rebuild bpf/ (make bpf)", err)
	}
	if err := bpf.SetOverlayViaStack(spec, o.ViaStack); err != nil {
		return nil, fmt.Errorf("%w: rebuild bpf/ (make bpf)", err)
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: m.OverlayReplacements()})
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("load overlay programs: %+v", ve)
		}
		return nil, fmt.Errorf("load overlay programs: %w", err)
	}
	return coll, nil
}

// attachPinned makes prog run at hook t of ifindex through the link
// pinned at pin: the pinned link's program is replaced when it is on
// ifindex, else a new link is attached and pinned.
func attachPinned(pin string, ifindex int, t ebpf.AttachType, prog *ebpf.Program) error {
	l, err := link.LoadPinnedLink(pin, nil)
	switch {
	case err == nil:
		if linkOn(l, ifindex, t) {
			err := l.Update(prog)
			l.Close()
			if err != nil {
				return fmt.Errorf("replace the program of link %s: %w", pin, err)
			}
			return nil
		}
		err := l.Unpin()
		l.Close()
		if err != nil {
			return fmt.Errorf("unpin stale link %s: %w", pin, err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("load pinned link %s: %w", pin, err)
	}
	l, err = link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: t})
	if err != nil {
		return fmt.Errorf("attach to tcx %s: %w", attachName(t), err)
	}
	defer l.Close()
	if err := l.Pin(pin); err != nil {
		_ = l.Detach()
		return fmt.Errorf("pin link %s: %w", pin, err)
	}
	return nil
}

// Remove detaches the tunnel device's programs and removes their pins
// (routing mode native, or the device gone); nothing pinned is fine.
func (o *Overlay) Remove() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.loaded = false
	var errs []error
	for _, hk := range overlayHooks {
		if err := removeLinkPin(filepath.Join(o.Layout.OverlayDir(), hk.prog)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
