package e2enetpol

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// NetpolFocus is the Ginkgo focus of the NetworkPolicy specs of Kubernetes'
// e2e suite: "[sig-network] Netpol" (TCP), "Netpol [LinuxOnly]" (UDP),
// "Netpol [Feature:SCTPConnectivity] [LinuxOnly]" (SCTP) and "Netpol API"
// (51 specs in v1.37.2: 43 TCP, 3 UDP, 3 SCTP, 2 API).
const NetpolFocus = `\[sig-network\] Netpol`

// ConformanceFocus is the Ginkgo focus of sig-network's conformance specs
// (47 in v1.37.2): Services, EndpointSlices, DNS, Networking (pod to pod
// and node to pod), Proxy, HostPort and the networking APIs.
const ConformanceFocus = `\[sig-network\].*\[Conformance\]`

// ServicesFocus is the Ginkgo focus of the Services specs besides
// Conformance's: "[sig-network] Services", the Services part of
// "Networking Granular Checks" and "HostPort" (72 specs in v1.37.2, 56
// without the 16 [Conformance] ones, which are the conformance suite's).
const ServicesFocus = `\[sig-network\] (Services|Networking Granular Checks: Services|HostPort) `

// DisruptivePattern matches the specs that restart a node's kube-proxy or
// the API server over SSH.
const DisruptivePattern = `\[Disruptive\]`

// SCTPPattern matches the specs that need SCTP in the kernel.
const SCTPPattern = `\[Feature:SCTPConnectivity\]`

// Suite is a set of the e2e suite's specs the runner runs.
type Suite struct {
	// Name names it in the summary and on the command line ("netpol").
	Name string
	// Title heads the summary ("Netpol").
	Title string
	// Focus selects its specs: every spec the runner runs matches it,
	// whatever else it is given.
	Focus string
	// Exclude leaves out the specs of Focus that belong to another suite
	// (not reported as skipped); empty means none.
	Exclude string
	// Rules skip specs of the suite that cannot run on these clusters,
	// reported with their reason.
	Rules []SkipRule
}

// The suites the runner knows.
var (
	// Netpol are the NetworkPolicy specs (make e2e-netpol).
	Netpol = Suite{Name: "netpol", Title: "Netpol", Focus: NetpolFocus}
	// Conformance are sig-network's conformance specs (make e2e-conformance).
	Conformance = Suite{Name: "conformance", Title: "sig-network Conformance", Focus: ConformanceFocus}
	// Services are the Services, NodePort, traffic policy, session
	// affinity and hostPort specs outside Conformance (make e2e-services).
	Services = Suite{
		Name: "services", Title: "sig-network Services (outside Conformance)",
		Focus: ServicesFocus, Exclude: `\[Conformance\]`,
		Rules: []SkipRule{{
			Pattern: DisruptivePattern,
			Reason:  "Disruptive: restarts kube-proxy or the API server over SSH; these nodes run no SSH server",
		}},
	}
)

// suites are the suites SuiteNamed knows.
var suites = []Suite{Netpol, Conformance, Services}

// SuiteNamed returns the suite called name.
//
// Errors: no suite has that name.
func SuiteNamed(name string) (Suite, error) {
	var known []string
	for _, s := range suites {
		if s.Name == name {
			return s, nil
		}
		known = append(known, strconv.Quote(s.Name))
	}
	return Suite{}, fmt.Errorf("no suite %q: want one of %s", name, strings.Join(known, ", "))
}

// SkipRule leaves out the specs whose full text matches Pattern, for
// Reason: something the run detected the cluster or the machine lacks.
type SkipRule struct {
	Pattern string
	Reason  string
}

// Filter says which specs of a suite to run and which to skip, and why.
type Filter struct {
	// Suite is the suite; its zero value is Netpol.
	Suite Suite
	// Focus narrows the suite's specs to those whose name also matches it
	// (a Go regular expression, as Ginkgo's --focus); empty means all.
	Focus string
	// Skip leaves out the specs whose name matches it; empty means none.
	Skip string
	// Rules leave out specs for what is missing (see [SCTPRule],
	// [DNSRule]); the first rule that matches gives the reason.
	Rules []SkipRule
}

// rule leaves out the specs whose full text matches re, for reason.
type rule struct {
	re     *regexp.Regexp
	reason string
}

// compiled is a Filter ready to apply to spec texts.
type compiled struct {
	suite   *regexp.Regexp
	exclude *regexp.Regexp // nil: none
	focus   *regexp.Regexp // nil: all of the suite
	skips   []rule
}

// suite is f.Suite, Netpol if unset.
func (f Filter) suite() Suite {
	if f.Suite.Focus == "" {
		return Netpol
	}
	return f.Suite
}

// compile checks the filter's expressions.
//
// Errors: Focus, Skip or a rule's pattern is not a valid regular
// expression.
func (f Filter) compile() (compiled, error) {
	c := compiled{suite: regexp.MustCompile(f.suite().Focus)}
	if x := f.suite().Exclude; x != "" {
		c.exclude = regexp.MustCompile(x)
	}
	if f.Focus != "" {
		re, err := regexp.Compile(f.Focus)
		if err != nil {
			return compiled{}, fmt.Errorf("focus %q: %w", f.Focus, err)
		}
		c.focus = re
	}
	for _, r := range slices.Concat(f.suite().Rules, f.Rules) {
		re, err := regexp.Compile(r.Pattern)
		if err != nil {
			return compiled{}, fmt.Errorf("skip rule %q: %w", r.Pattern, err)
		}
		c.skips = append(c.skips, rule{re, r.Reason})
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

// SCTPRule is the rule that skips the SCTP specs when the kernel has no
// SCTP (ok false), with why (see [KernelSCTP]); with ok it is nil.
func SCTPRule(ok bool, why string) []SkipRule {
	if ok {
		return nil
	}
	reason := "SCTP: this kernel has no SCTP"
	if why != "" {
		reason += " (" + why + ")"
	}
	return []SkipRule{{Pattern: SCTPPattern, Reason: reason}}
}

// Spec is a spec the runner runs.
type Spec struct {
	// Name is its text without the suite's description.
	Name string
	// Text is its full text, as focus and skip patterns match it.
	Text string
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
		if !c.suite.MatchString(text) || (c.exclude != nil && c.exclude.MatchString(text)) || (c.focus != nil && !c.focus.MatchString(text)) {
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
			p.Run = append(p.Run, Spec{Name: s.name(), Text: text, Focus: "^" + regexp.QuoteMeta(text) + "$"})
		}
	}
	slices.SortFunc(p.Run, func(a, b Spec) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(p.Skipped, func(a, b Result) int { return strings.Compare(a.Name, b.Name) })
	return p
}

// Skip moves the specs to run that match one of rules to the skipped
// ones, with the rule's reason: for what is detected once the cluster runs
// (see [DNSRule]).
//
// Errors: a rule's pattern is not a valid regular expression.
func (p Plan) Skip(rules ...SkipRule) (Plan, error) {
	var out Plan
	out.Skipped = slices.Clone(p.Skipped)
	res := make([]*regexp.Regexp, len(rules))
	for i, r := range rules {
		re, err := regexp.Compile(r.Pattern)
		if err != nil {
			return Plan{}, fmt.Errorf("skip rule %q: %w", r.Pattern, err)
		}
		res[i] = re
	}
next:
	for _, s := range p.Run {
		for i, re := range res {
			if re.MatchString(s.Text) {
				out.Skipped = append(out.Skipped, Result{Name: s.Name, Outcome: Skipped, Reason: rules[i].Reason})
				continue next
			}
		}
		out.Run = append(out.Run, s)
	}
	slices.SortFunc(out.Skipped, func(a, b Result) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
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
