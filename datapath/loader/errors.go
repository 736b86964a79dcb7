package loader

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cilium/ebpf"
)

// ErrLinkNotFound is returned by Ops.Update when the endpoint's host veth
// does not exist (yet); the reconciler retries.
var ErrLinkNotFound = errors.New("host veth not found")

// ErrVerifier is wrapped by the error of a load the kernel's verifier
// rejected; the error's text carries the end of the verifier's log.
var ErrVerifier = errors.New("the kernel's BPF verifier rejected the program")

// Bounds of the verifier log kept in an error (and so in the row's status
// and the endpoint's log): the verifier explains a rejection in its last
// lines, the rest is the trace of the instructions that led there.
const (
	verifierLogLines = 40
	verifierLogBytes = 4096
)

// loadError turns the error of loading a collection into the loader's:
// a verifier rejection wraps ErrVerifier and keeps the end of the log.
func loadError(err error) error {
	var ve *ebpf.VerifierError
	if !errors.As(err, &ve) {
		return err
	}
	return fmt.Errorf("%w: %s", ErrVerifier, VerifierLog(err))
}

// VerifierLog is the end of the verifier's log in err (at most 40 lines,
// 4 KiB), preceded by the error that stopped the load; "" when err holds
// no verifier error.
func VerifierLog(err error) string {
	var ve *ebpf.VerifierError
	if !errors.As(err, &ve) {
		return ""
	}
	s := fmt.Sprintf("%-*v", verifierLogLines, ve)
	if len(s) > verifierLogBytes {
		// Keep the end, from a line start.
		cut := s[len(s)-verifierLogBytes:]
		if i := strings.IndexByte(cut, '\n'); i >= 0 {
			cut = cut[i+1:]
		}
		s = ve.Error() + "\n\t(log truncated)\n" + cut
	}
	return s
}
