package link

import (
	"errors"
	"net"
	"reflect"
	"testing"
)

func mustCIDR(t *testing.T, s string) net.IPNet {
	t.Helper()
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		t.Fatal(err)
	}
	return *n
}

func validSpec() Spec {
	return Spec{
		ContainerID: "c0ffee",
		NetnsPath:   "/var/run/netns/pod",
		IPv4:        net.ParseIP("10.0.1.5"),
		Gateway:     net.ParseIP("10.0.1.1"),
	}
}

func TestSpecDefaults(t *testing.T) {
	s, err := validSpec().normalize()
	if err != nil {
		t.Fatal(err)
	}
	if s.IfName != "eth0" || s.HostIfName != HostInterfaceName("c0ffee", "eth0") || s.MTU != 1500 {
		t.Errorf("defaults: IfName %q HostIfName %q MTU %d", s.IfName, s.HostIfName, s.MTU)
	}
	if len(s.IPv4) != net.IPv4len || len(s.Gateway) != net.IPv4len {
		t.Errorf("addresses not in 4-byte form: %v %v", s.IPv4, s.Gateway)
	}
	wantRoutes := []Route{
		{Dst: mustCIDR(t, "10.0.1.1/32")},
		{Dst: mustCIDR(t, "0.0.0.0/0"), Via: net.ParseIP("10.0.1.1").To4()},
	}
	if got := s.podRoutes(); !reflect.DeepEqual(got, wantRoutes) {
		t.Errorf("podRoutes() = %v, want %v", got, wantRoutes)
	}
}

func TestSpecRoutes(t *testing.T) {
	spec := validSpec()
	spec.MTU = 9000
	spec.RouteMTU = 8950
	spec.Routes = []Route{
		{Dst: mustCIDR(t, "10.0.0.0/8")},
		{Dst: mustCIDR(t, "192.168.0.0/16"), MTU: 1400},
	}
	s, err := spec.normalize()
	if err != nil {
		t.Fatal(err)
	}
	gw := net.ParseIP("10.0.1.1").To4()
	want := []Route{
		{Dst: mustCIDR(t, "10.0.1.1/32")},
		{Dst: mustCIDR(t, "10.0.0.0/8"), Via: gw, MTU: 8950},
		{Dst: mustCIDR(t, "192.168.0.0/16"), Via: gw, MTU: 1400},
	}
	if got := s.podRoutes(); !reflect.DeepEqual(got, want) {
		t.Errorf("podRoutes() = %v, want %v", got, want)
	}
	// The caller's slice is not aliased.
	spec.Routes[0].MTU = 1
	if s.Routes[0].MTU != 8950 {
		t.Error("normalized spec shares Routes with the caller")
	}
}

func TestSpecInvalid(t *testing.T) {
	tests := map[string]func(*Spec){
		"no container ID":      func(s *Spec) { s.ContainerID = "" },
		"no netns":             func(s *Spec) { s.NetnsPath = "" },
		"long ifname":          func(s *Spec) { s.IfName = "a-very-long-name0" },
		"bad host ifname":      func(s *Spec) { s.HostIfName = "lxc/1" },
		"huge container ID":    func(s *Spec) { s.ContainerID = string(make([]byte, 300)) },
		"MTU too small":        func(s *Spec) { s.MTU = 60 },
		"MTU too big":          func(s *Spec) { s.MTU = 70000 },
		"route MTU over dev":   func(s *Spec) { s.RouteMTU = 1600 },
		"multicast MAC":        func(s *Spec) { s.MAC = net.HardwareAddr{1, 0, 0, 0, 0, 1} },
		"short MAC":            func(s *Spec) { s.MAC = net.HardwareAddr{2, 0, 0} },
		"zero MAC":             func(s *Spec) { s.MAC = net.HardwareAddr{0, 0, 0, 0, 0, 0} },
		"no IPv4":              func(s *Spec) { s.IPv4 = nil },
		"IPv6 pod address":     func(s *Spec) { s.IPv4 = net.ParseIP("fd00::5") },
		"loopback pod address": func(s *Spec) { s.IPv4 = net.ParseIP("127.0.0.1") },
		"no gateway":           func(s *Spec) { s.Gateway = nil },
		"gateway is pod":       func(s *Spec) { s.Gateway = s.IPv4 },
		"multicast gateway":    func(s *Spec) { s.Gateway = net.ParseIP("224.0.0.1") },
		"IPv6 route":           func(s *Spec) { s.Routes = []Route{{Dst: mustCIDR(t, "fd00::/8")}} },
		"route host bits": func(s *Spec) {
			s.Routes = []Route{{Dst: net.IPNet{IP: net.ParseIP("10.0.0.1"), Mask: net.CIDRMask(8, 32)}}}
		},
		"route via IPv6": func(s *Spec) {
			s.Routes = []Route{{Dst: mustCIDR(t, "10.0.0.0/8"), Via: net.ParseIP("fd00::1")}}
		},
		"route MTU too big": func(s *Spec) { s.Routes = []Route{{Dst: mustCIDR(t, "10.0.0.0/8"), MTU: 9000}} },
	}
	for name, mutate := range tests {
		t.Run(name, func(t *testing.T) {
			spec := validSpec()
			mutate(&spec)
			if _, err := spec.normalize(); !errors.Is(err, ErrInvalidSpec) {
				t.Errorf("normalize() = %v, want ErrInvalidSpec", err)
			}
		})
	}
}

func TestSpecLinkLocalGateway(t *testing.T) {
	spec := validSpec()
	spec.Gateway = net.ParseIP("169.254.1.1")
	if _, err := spec.normalize(); err != nil {
		t.Errorf("link-local gateway refused: %v", err)
	}
}

func TestRandomMAC(t *testing.T) {
	for range 100 {
		mac, err := randomMAC()
		if err != nil {
			t.Fatal(err)
		}
		if len(mac) != 6 || mac[0]&0x01 != 0 || mac[0]&0x02 == 0 {
			t.Fatalf("randomMAC() = %s: want a unicast, locally administered address", mac)
		}
	}
}

func TestSpecDoesNotAliasCaller(t *testing.T) {
	spec := validSpec()
	spec.IPv4 = net.IP{10, 0, 1, 5}
	spec.Routes = []Route{{Dst: net.IPNet{IP: net.IP{10, 0, 0, 0}, Mask: net.CIDRMask(8, 32)}}}
	s, err := spec.normalize()
	if err != nil {
		t.Fatal(err)
	}
	spec.IPv4[3] = 99
	spec.Routes[0].Dst.IP[0] = 99
	if s.IPv4.String() != "10.0.1.5" || s.Routes[0].Dst.IP.String() != "10.0.0.0" {
		t.Errorf("normalized spec changed with the caller's: %v %v", s.IPv4, s.Routes[0].Dst)
	}
}
