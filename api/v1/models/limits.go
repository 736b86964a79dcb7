package models

import (
	"errors"
	"fmt"
)

// Limits of the API's input. The agent answers 400 with the field's name
// when a request exceeds one; Documentation/operations/cli.md lists them.
const (
	// MaxContainerIDLen bounds a container ID (runtimes use 64 hex digits).
	MaxContainerIDLen = 256
	// MaxIfNameLen is the kernel's limit on an interface name (IFNAMSIZ-1).
	MaxIfNameLen = 15
	// MaxNamespaceLen bounds a Kubernetes namespace name (a DNS label).
	MaxNamespaceLen = 63
	// MaxPodNameLen bounds a Kubernetes object name (a DNS subdomain).
	MaxPodNameLen = 253
	// MaxUIDLen bounds a Kubernetes UID (a UUID is 36 bytes).
	MaxUIDLen = 128
	// MaxOwnerLen bounds an IPAM owner, "namespace/pod".
	MaxOwnerLen = MaxNamespaceLen + 1 + MaxPodNameLen
	// MaxPathLen bounds a file path such as a network namespace (PATH_MAX).
	MaxPathLen = 4096
	// MaxAddressLen bounds a textual IP or MAC address.
	MaxAddressLen = 64
	// MaxLabelKeyLen bounds a label key with its source ("k8s:" + a
	// Kubernetes key of up to 253+1+63 bytes, with room for longer sources).
	MaxLabelKeyLen = 512
	// MaxLabelValueLen bounds a label value (Kubernetes allows 63; other
	// sources more).
	MaxLabelValueLen = 256
	// MaxLabels bounds the entries of a labels patch, added plus deleted.
	MaxLabels = 256
)

// checkLen reports a field longer than max bytes.
func checkLen(field, s string, max int) error {
	if len(s) > max {
		return fmt.Errorf("%s is %d bytes long, the limit is %d", field, len(s), max)
	}
	return nil
}

// Validate checks the lengths of the request's strings and the interface
// index, and names the first field that is wrong.
func (r *EndpointChangeRequest) Validate() error {
	checks := []struct {
		field string
		value string
		max   int
	}{
		{"container-id", r.ContainerID, MaxContainerIDLen},
		{"container-interface-name", r.ContainerInterfaceName, MaxIfNameLen},
		{"k8s-namespace", r.K8sNamespace, MaxNamespaceLen},
		{"k8s-pod-name", r.K8sPodName, MaxPodNameLen},
		{"k8s-uid", r.K8sUID, MaxUIDLen},
		{"interface-name", r.InterfaceName, MaxIfNameLen},
		{"mac", r.MAC, MaxAddressLen},
		{"host-mac", r.HostMAC, MaxAddressLen},
		{"netns-path", r.NetnsPath, MaxPathLen},
		{"addressing.ipv4", r.Addressing.IPV4, MaxAddressLen},
		{"addressing.ipv6", r.Addressing.IPV6, MaxAddressLen},
	}
	for _, c := range checks {
		if err := checkLen(c.field, c.value, c.max); err != nil {
			return err
		}
	}
	if r.InterfaceIndex < 0 {
		return fmt.Errorf("interface-index is %d: want 0 or a positive ifindex", r.InterfaceIndex)
	}
	return nil
}

// Validate bounds the number of labels and the length of each key and
// value.
func (p *LabelsPatch) Validate() error {
	if n := len(p.Add) + len(p.Delete); n > MaxLabels {
		return fmt.Errorf("labels patch has %d entries, the limit is %d", n, MaxLabels)
	}
	for k, v := range p.Add {
		if k == "" {
			return errors.New("add: empty label key")
		}
		if err := checkLen("add: label key", k, MaxLabelKeyLen); err != nil {
			return err
		}
		if err := checkLen(fmt.Sprintf("add: value of label %q", k), v, MaxLabelValueLen); err != nil {
			return err
		}
	}
	for _, k := range p.Delete {
		if err := checkLen("delete: label key", k, MaxLabelKeyLen); err != nil {
			return err
		}
	}
	return nil
}
