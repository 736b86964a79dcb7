package e2enetpol

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"syscall"
)

// NetpolFocus is the Ginkgo focus of the NetworkPolicy specs of Kubernetes'
// e2e suite: "[sig-network] Netpol" (TCP), "Netpol [LinuxOnly]" (UDP),
// "Netpol [Feature:SCTPConnectivity] [LinuxOnly]" (SCTP) and "Netpol API"
// (51 specs in v1.37.2: 43 TCP, 3 UDP, 3 SCTP, 2 API). Every spec the
// runner selects matches it, whatever else it is given.
const NetpolFocus = `\[sig-network\] Netpol`

// SCTPPattern matches the specs that need SCTP in the kernel.
const SCTPPattern = `\[Feature:SCTPConnectivity\]`

// Filter says which Netpol specs to run and which to skip, and why.
type Filter struct {
	// Focus narrows the Netpol specs to those whose name also matches it
	// (a Go regular expression, as Ginkgo's --focus); empty means all.
	Focus string
	// Skip leaves out the specs whose name matches it; empty means none.
	Skip string
	// SCTP says whether the kernel has SCTP; without it the SCTP specs are
	// skipped with NoSCTPReason.
	SCTP bool
	// NoSCTPReason says why SCTP is missing (see [KernelSCTP]).
	NoSCTPReason string
}

// rule leaves out the specs whose full text matches re, for reason.
type rule struct {
	re     *regexp.Regexp
	reason string
}

// compiled is a Filter ready to apply to spec texts.
type compiled struct {
	focus *regexp.Regexp
	skips []rule
}

// FocusRegexp is the focus the suite is given: [NetpolFocus] and, if
// Focus is set, that as well, in that order (a spec's text starts with its
// containers' texts, so Netpol's come before the spec's own words).
func (f Filter) FocusRegexp() string {
	if f.Focus == "" {
		return NetpolFocus
	}
	return NetpolFocus + `.*(?:` + f.Focus + `)`
}

// compile checks the filter's expressions.
//
// Errors: Focus or Skip is not a valid regular expression.
func (f Filter) compile() (compiled, error) {
	focus, err := regexp.Compile(f.FocusRegexp())
	if err != nil {
		return compiled{}, fmt.Errorf("focus %q: %w", f.Focus, err)
	}
	c := compiled{focus: focus}
	if !f.SCTP {
		reason := "SCTP: this kernel has no SCTP"
		if f.NoSCTPReason != "" {
			reason += " (" + f.NoSCTPReason + ")"
		}
		c.skips = append(c.skips, rule{regexp.MustCompile(SCTPPattern), reason})
	}
	if f.Skip != "" {
		re, err := regexp.Compile(f.Skip)
		if err != nil {
			return compiled{}, fmt.Errorf("skip %q: %w", f.Skip, err)
		}
		c.skips = append(c.skips, rule{re, fmt.Sprintf("matches SKIP=%s", f.Skip)})
	}
	return c, nil
}

// Spec is a spec the runner runs.
type Spec struct {
	// Name is its text without the suite's description.
	Name string
	// Focus selects exactly this spec: its full text, anchored and quoted.
	Focus string
}

// Plan is what a run does: the specs to run and those it skips with the
// reason, each sorted by name (Ginkgo shuffles the suite's containers).
type Plan struct {
	Run     []Spec
	Skipped []Result
}

// plan selects from the suite's specs (a dry run's report) those the filter
// focuses on, and splits them into those to run and those to skip.
func (c compiled) plan(r ginkgoReport) Plan {
	var p Plan
	for _, s := range r.SpecReports {
		if s.LeafNodeType != "It" {
			continue
		}
		text := s.text(r.SuiteDescription)
		if !c.focus.MatchString(text) {
			continue
		}
		skipped := false
		for _, k := range c.skips {
			if k.re.MatchString(text) {
				p.Skipped = append(p.Skipped, Result{Name: s.name(), Outcome: Skipped, Reason: k.reason})
				skipped = true
				break
			}
		}
		if !skipped {
			p.Run = append(p.Run, Spec{Name: s.name(), Focus: "^" + regexp.QuoteMeta(text) + "$"})
		}
	}
	slices.SortFunc(p.Run, func(a, b Spec) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(p.Skipped, func(a, b Result) int { return strings.Compare(a.Name, b.Name) })
	return p
}

// KernelSCTP reports whether this kernel can open an SCTP socket, and if
// not, why (the error of socket(2)).
func KernelSCTP() (ok bool, reason string) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, syscall.IPPROTO_SCTP)
	if err == nil {
		_ = syscall.Close(fd)
		return true, ""
	}
	if errors.Is(err, syscall.EPROTONOSUPPORT) || errors.Is(err, syscall.ESOCKTNOSUPPORT) {
		return false, "socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP): protocol not supported; no sctp module"
	}
	return false, "socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP): " + err.Error()
}
