package nodes

import (
	"fmt"
	"os"
	"strings"
)

// BootIDPath is where the Linux kernel publishes the ID of the current boot.
const BootIDPath = "/proc/sys/kernel/random/boot_id"

// ReadBootID reads the kernel's boot ID from path (BootIDPath outside
// tests). Everything that tells "before a reboot" from "after" uses it: the
// local-node row (published as the CiliumNode's spec.bootid) and the IPAM
// state file, which is read before the local node is known.
//
// Possible errors: the file cannot be read, or is empty.
func ReadBootID(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read boot ID: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if id == "" {
		return "", fmt.Errorf("read boot ID: %s is empty", path)
	}
	return id, nil
}
