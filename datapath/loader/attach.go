package loader

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// filterPrefix names the clsact filters the loader installs (fallback),
// so that it removes only its own.
const filterPrefix = "cellium-"

// clsactPriority and clsactHandle identify the loader's filter on each
// clsact hook: replacing it is atomic.
const (
	clsactPriority = 1
	clsactHandle   = 1
)

// attach attaches the collection's two programs to ifindex (inside the
// namespace of h's thread) for endpoint id, replacing the programs of
// pinned links in place, and returns what it attached.
func (o *Ops) attach(h *netlink.Handle, id uint16, ifindex int, coll *ebpf.Collection) (applied, error) {
	a := applied{ifindex: ifindex, mode: ModeTCX}
	if o.forceClsact {
		a.mode = ModeClsact
	}
	for i, hk := range hooks {
		prog := coll.Programs[hk.prog]
		info, err := prog.Info()
		if err != nil {
			return a, fmt.Errorf("%s info: %w", hk.prog, err)
		}
		a.progs[i], _ = info.ID()
		if a.mode == ModeTCX {
			err := o.attachTCX(id, ifindex, hk, prog)
			if errors.Is(err, ebpf.ErrNotSupported) && i == 0 {
				a.mode = ModeClsact // a kernel without tcx
			} else if err != nil {
				return a, err
			}
		}
		if a.mode == ModeClsact {
			if err := attachClsact(h, ifindex, hk, prog); err != nil {
				return a, err
			}
		}
	}
	return a, nil
}

// attachTCX replaces the program of the pinned link of (id, hk) if it is
// attached to ifindex, or attaches a new link and pins it.
func (o *Ops) attachTCX(id uint16, ifindex int, hk hook, prog *ebpf.Program) error {
	pin := o.cfg.Layout.LinkPin(id, hk.prog)
	l, err := link.LoadPinnedLink(pin, nil)
	switch {
	case err == nil:
		if linkOn(l, ifindex, hk.tcx) {
			err := l.Update(prog)
			l.Close()
			if err != nil {
				return fmt.Errorf("replace %s in link %s: %w", hk.prog, pin, err)
			}
			return nil
		}
		// The link of a veth that is gone (or re-created under the same
		// name): drop it and attach anew.
		err := l.Unpin()
		l.Close()
		if err != nil {
			return fmt.Errorf("unpin stale link %s: %w", pin, err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("load pinned link %s: %w", pin, err)
	}
	l, err = link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: hk.tcx})
	if err != nil {
		return fmt.Errorf("attach %s to tcx %s: %w", hk.prog, attachName(hk.tcx), err)
	}
	defer l.Close()
	if err := os.MkdirAll(o.cfg.Layout.EndpointDir(id), 0o700); err != nil {
		_ = l.Detach()
		return fmt.Errorf("create %s: %w", o.cfg.Layout.EndpointDir(id), err)
	}
	if err := l.Pin(pin); err != nil {
		_ = l.Detach()
		return fmt.Errorf("pin link %s: %w", pin, err)
	}
	return nil
}

func attachName(t ebpf.AttachType) string {
	if t == ebpf.AttachTCXIngress {
		return "ingress"
	}
	return "egress"
}

// linkOn reports whether l is a tcx link attached to ifindex at hook t.
func linkOn(l link.Link, ifindex int, t ebpf.AttachType) bool {
	info, err := l.Info()
	if err != nil || info.TCX() == nil {
		return false
	}
	tcx := info.TCX()
	return int(tcx.Ifindex) == ifindex && ebpf.AttachType(tcx.AttachType) == t
}

// intact reports whether what a describes is still attached: each pinned
// link (or clsact filter) on a.ifindex runs the program recorded.
func (o *Ops) intact(h *netlink.Handle, id uint16, a applied) bool {
	for i, hk := range hooks {
		var got ebpf.ProgramID
		if a.mode == ModeTCX {
			l, err := link.LoadPinnedLink(o.cfg.Layout.LinkPin(id, hk.prog), nil)
			if err != nil {
				return false
			}
			if linkOn(l, a.ifindex, hk.tcx) {
				if info, err := l.Info(); err == nil {
					got = info.Program
				}
			}
			l.Close()
		} else {
			f, err := ownFilter(h, a.ifindex, hk)
			if err != nil || f == nil {
				return false
			}
			got = ebpf.ProgramID(f.Id)
		}
		if got != a.progs[i] {
			return false
		}
	}
	return true
}

// removeLinkPin detaches the link pinned at pin and removes the pin; a
// missing pin or a link already detached (its device gone) is fine.
func removeLinkPin(pin string) error {
	l, err := link.LoadPinnedLink(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		// Not a link we can load: remove the file all the same.
		if rmErr := os.Remove(pin); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
			return fmt.Errorf("remove pin %s: %w (load: %v)", pin, rmErr, err)
		}
		return nil
	}
	defer l.Close()
	if err := l.Detach(); err != nil && !errors.Is(err, ebpf.ErrNotSupported) && !errors.Is(err, unix.ENOLINK) {
		return fmt.Errorf("detach link %s: %w", pin, err)
	}
	if err := l.Unpin(); err != nil {
		return fmt.Errorf("unpin link %s: %w", pin, err)
	}
	return nil
}

// attachClsact installs prog as the loader's direct-action filter on
// ifindex's clsact hook, replacing the previous one atomically.
func attachClsact(h *netlink.Handle, ifindex int, hk hook, prog *ebpf.Program) error {
	qdisc := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}
	if err := h.QdiscReplace(qdisc); err != nil {
		return fmt.Errorf("add clsact qdisc to ifindex %d: %w", ifindex, err)
	}
	f := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: ifindex, Parent: hk.parent, Handle: clsactHandle,
			Priority: clsactPriority, Protocol: unix.ETH_P_ALL,
		},
		Fd: prog.FD(), Name: filterPrefix + hk.prog, DirectAction: true,
	}
	if err := h.FilterReplace(f); err != nil {
		return fmt.Errorf("attach %s as clsact filter: %w", hk.prog, err)
	}
	return nil
}

// ownFilter returns the loader's filter on hk's clsact hook of ifindex,
// or nil.
func ownFilter(h *netlink.Handle, ifindex int, hk hook) (*netlink.BpfFilter, error) {
	l, err := h.LinkByIndex(ifindex)
	if err != nil {
		return nil, err
	}
	filters, err := h.FilterList(l, hk.parent)
	if err != nil {
		return nil, err
	}
	for _, f := range filters {
		if bf, ok := f.(*netlink.BpfFilter); ok && strings.HasPrefix(bf.Name, filterPrefix) {
			return bf, nil
		}
	}
	return nil, nil
}

// removeFilters deletes the loader's clsact filters on ifindex (the
// fallback's); none is fine.
func removeFilters(h *netlink.Handle, ifindex int) error {
	var errs []error
	for _, hk := range hooks {
		f, err := ownFilter(h, ifindex, hk)
		if err != nil {
			if errors.Is(err, unix.ENODEV) || errors.Is(err, unix.EINVAL) {
				continue // no such device or no clsact qdisc
			}
			errs = append(errs, fmt.Errorf("list filters: %w", err))
			continue
		}
		if f == nil {
			continue
		}
		if err := h.FilterDel(f); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("delete filter %s: %w", f.Name, err))
		}
	}
	return errors.Join(errs...)
}
