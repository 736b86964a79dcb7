package link

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

const (
	// HostIfPrefix starts the name of every host-side endpoint link.
	HostIfPrefix = "lxc"

	// DefaultIfName is the pod-side interface name when Spec.IfName is empty.
	DefaultIfName = "eth0"

	// maxIfNameLen is IFNAMSIZ-1: the kernel keeps names in 16 bytes with
	// a terminating NUL.
	maxIfNameLen = 15

	// hashLen is how many hex digits of the hash go into generated names:
	// "lxc" + 12 = 15 bytes, the longest name the kernel accepts.
	hashLen = 12

	// tmpPeerPrefix starts the name the pod-side veth carries in the host
	// namespace, before it moves into the pod and becomes IfName.
	tmpPeerPrefix = "tmp"

	// aliasPrefix starts the alias (IFLA_IFALIAS) of links made here. The
	// alias records the container ID and interface name so that restore and
	// GC can tell whose link it is without any other state.
	aliasPrefix = "cellium:"

	// maxAliasLen is IFALIASZ-1.
	maxAliasLen = 255
)

// HostInterfaceName returns the host-side link name of the endpoint for
// containerID's interface ifName (DefaultIfName when empty): "lxc" followed
// by the first 12 hex digits of sha256("<containerID>:<ifName>"), 15 bytes
// in all. It is the same name Cilium gives, so the same container gets the
// same link name after an agent restart or a CNI retry.
func HostInterfaceName(containerID, ifName string) string {
	return HostIfPrefix + endpointHash(containerID, ifName)
}

func endpointHash(containerID, ifName string) string {
	if ifName == "" {
		ifName = DefaultIfName
	}
	sum := sha256.Sum256([]byte(containerID + ":" + ifName))
	return hex.EncodeToString(sum[:])[:hashLen]
}

// tempPeerName is the name the pod-side veth had in the host namespace
// when earlier versions created it there and moved it; SetupEndpoint now
// creates it in the pod directly, but still removes such a leftover from
// a crashed attempt of an earlier version. It is derived from the
// host-side name, so it is recognisable.
func tempPeerName(hostIfName string) string {
	suffix := strings.TrimPrefix(hostIfName, HostIfPrefix)
	if len(suffix) != hashLen {
		sum := sha256.Sum256([]byte(hostIfName))
		suffix = hex.EncodeToString(sum[:])[:hashLen]
	}
	return tmpPeerPrefix + suffix
}

// hostAlias is the alias put on the host-side link.
func hostAlias(containerID, ifName string) string {
	return aliasPrefix + containerID + "/" + ifName
}

// podAlias is the alias put on the pod-side link; it names the host side.
func podAlias(hostIfName string) string {
	return aliasPrefix + hostIfName
}

// parseHostAlias returns the container ID and interface name recorded in a
// host-side alias, and false if the alias was not made by hostAlias.
// Interface names cannot contain '/', so the last '/' separates them.
func parseHostAlias(alias string) (containerID, ifName string, ok bool) {
	rest, found := strings.CutPrefix(alias, aliasPrefix)
	if !found {
		return "", "", false
	}
	i := strings.LastIndexByte(rest, '/')
	if i <= 0 || i == len(rest)-1 {
		return "", "", false
	}
	return rest[:i], rest[i+1:], true
}

// checkIfName reports why name is not a valid Linux interface name, the
// same rules as the kernel's dev_valid_name.
func checkIfName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("empty interface name")
	case len(name) > maxIfNameLen:
		return fmt.Errorf("interface name %q is %d bytes, the limit is %d", name, len(name), maxIfNameLen)
	case name == "." || name == "..":
		return fmt.Errorf("interface name %q is reserved", name)
	case strings.ContainsAny(name, "/: \t\n\v\f\r"):
		return fmt.Errorf("interface name %q contains '/', ':' or white space", name)
	}
	return nil
}
