package e2enetpol

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
)

// ginkgoReport is the part of a Ginkgo v2 JSON report (--ginkgo.json-report,
// a list of types.Report) that the runner reads; the types are Ginkgo's,
// copied by field name so that the main module does not depend on Ginkgo.
type ginkgoReport struct {
	SuiteDescription string
	SuiteSucceeded   bool
	StartTime        time.Time
	EndTime          time.Time
	RunTime          time.Duration
	// SpecialSuiteFailureReasons say why a suite failed besides its specs
	// (a timeout, an interrupt).
	SpecialSuiteFailureReasons []string
	SpecReports                []ginkgoSpecReport
}

type ginkgoSpecReport struct {
	ContainerHierarchyTexts  []string
	ContainerHierarchyLabels [][]string
	LeafNodeType             string
	LeafNodeLabels           []string
	LeafNodeText             string
	State                    string
	RunTime                  time.Duration
	Failure                  struct {
		Message  string
		Location struct {
			FileName   string
			LineNumber int
		}
		FailureNodeType string
	}
}

// Ginkgo's spec states, as its JSON report spells them.
const (
	statePassed  = "passed"
	stateSkipped = "skipped"
	statePending = "pending"
)

// readReport reads a Ginkgo JSON report: e2e.test runs one suite, so the
// report holds one.
//
// Errors: the file is unreadable, not JSON of a report, or holds no suite.
func readReport(path string) (ginkgoReport, error) {
	f, err := os.Open(path)
	if err != nil {
		return ginkgoReport{}, fmt.Errorf("read ginkgo report: %w", err)
	}
	defer f.Close()
	return parseReport(f)
}

func parseReport(r io.Reader) (ginkgoReport, error) {
	var reports []ginkgoReport
	if err := json.NewDecoder(r).Decode(&reports); err != nil {
		return ginkgoReport{}, fmt.Errorf("parse ginkgo report: %w", err)
	}
	if len(reports) != 1 {
		return ginkgoReport{}, fmt.Errorf("parse ginkgo report: %d suites, want 1", len(reports))
	}
	return reports[0], nil
}

// trimReport rewrites the JSON report at path without the specs the run
// left out (state "skipped" and no message: the thousands of specs of the
// suite that the focus did not select), which make each report ~5 MB.
// Fields the runner does not read are kept as they were.
//
// Errors: the file cannot be read, parsed or written.
func trimReport(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("trim ginkgo report: %w", err)
	}
	var reports []map[string]json.RawMessage
	if err := json.Unmarshal(data, &reports); err != nil {
		return fmt.Errorf("trim ginkgo report %s: %w", path, err)
	}
	for _, r := range reports {
		var specs []json.RawMessage
		if err := json.Unmarshal(r["SpecReports"], &specs); err != nil {
			return fmt.Errorf("trim ginkgo report %s: %w", path, err)
		}
		kept := specs[:0]
		for _, raw := range specs {
			var s ginkgoSpecReport
			if err := json.Unmarshal(raw, &s); err != nil {
				return fmt.Errorf("trim ginkgo report %s: %w", path, err)
			}
			if s.State == stateSkipped && s.Failure.Message == "" {
				continue
			}
			kept = append(kept, raw)
		}
		if r["SpecReports"], err = json.Marshal(kept); err != nil {
			return fmt.Errorf("trim ginkgo report %s: %w", path, err)
		}
	}
	out, err := json.Marshal(reports)
	if err != nil {
		return fmt.Errorf("trim ginkgo report %s: %w", path, err)
	}
	return os.WriteFile(path, out, 0o644)
}

// text is a spec's full text as Ginkgo's focus and skip match it: the
// suite's description, the containers' texts and the spec's own, joined by
// spaces.
func (s ginkgoSpecReport) text(suite string) string {
	parts := []string{suite}
	for _, t := range s.ContainerHierarchyTexts {
		if t != "" {
			parts = append(parts, t)
		}
	}
	if s.LeafNodeText != "" {
		parts = append(parts, s.LeafNodeText)
	}
	return strings.Join(parts, " ")
}

// name is a spec's name without the suite's description, as people quote
// it: "[sig-network] Netpol NetworkPolicy between server and client should
// ...".
func (s ginkgoSpecReport) name() string {
	return strings.TrimPrefix(s.text(""), " ")
}

// labels are the spec's and its containers' labels.
func (s ginkgoSpecReport) labels() []string {
	var out []string
	for _, l := range s.ContainerHierarchyLabels {
		out = append(out, l...)
	}
	out = append(out, s.LeafNodeLabels...)
	slices.Sort(out)
	return slices.Compact(out)
}

// Outcome is what happened to one spec.
type Outcome string

// The outcomes a spec can have in a [Summary].
const (
	Passed  Outcome = "passed"
	Failed  Outcome = "failed" // failed, panicked, timed out, aborted or interrupted
	Skipped Outcome = "skipped"
)

// Result is one spec's outcome.
type Result struct {
	// Name is the spec's text without the suite's description.
	Name    string
	Outcome Outcome
	// Reason says why the spec failed (Ginkgo's failure message and
	// location, or the runner's: a timeout, no report) or was skipped.
	Reason  string
	RunTime time.Duration
	// Nodes are the nodes the spec's pods ran on, when the run recorded
	// them (Config.Placement).
	Nodes []string
}

// Summary is the outcome of a run.
type Summary struct {
	// Suite titles the summary ("Netpol"); empty means "Netpol".
	Suite   string
	Results []Result
	// RunTime is the wall-clock time of the whole run.
	RunTime time.Duration
}

// Count returns how many specs had outcome o.
func (s Summary) Count(o Outcome) int {
	n := 0
	for _, r := range s.Results {
		if r.Outcome == o {
			n++
		}
	}
	return n
}

// Failures are the results of the failed specs.
func (s Summary) Failures() []Result {
	var out []Result
	for _, r := range s.Results {
		if r.Outcome == Failed {
			out = append(out, r)
		}
	}
	return out
}

// Write prints the summary: one line of counts and the run time, then the
// failed specs with the first line of their reason, then the skipped specs
// grouped by reason.
func (s Summary) Write(w io.Writer) error {
	var b strings.Builder
	title := s.Suite
	if title == "" {
		title = Netpol.Title
	}
	fmt.Fprintf(&b, "%s: %d passed, %d failed, %d skipped of %d specs in %s\n",
		title, s.Count(Passed), s.Count(Failed), s.Count(Skipped), len(s.Results), s.RunTime.Round(time.Second))
	if ran, spread, nodes := s.placement(); ran > 0 {
		fmt.Fprintf(&b, "pods' nodes: %d of the %d specs that ran pods had them on two or more nodes (%s)\n",
			spread, ran, strings.Join(nodes, ", "))
	}
	if f := s.Failures(); len(f) > 0 {
		b.WriteString("failed:\n")
		for _, r := range f {
			fmt.Fprintf(&b, "  %s (%s)\n      %s\n", r.Name, r.RunTime.Round(time.Second), firstLine(r.Reason))
		}
	}
	skipped := map[string][]string{}
	var reasons []string
	for _, r := range s.Results {
		if r.Outcome != Skipped {
			continue
		}
		if _, ok := skipped[r.Reason]; !ok {
			reasons = append(reasons, r.Reason)
		}
		skipped[r.Reason] = append(skipped[r.Reason], r.Name)
	}
	for _, reason := range reasons {
		fmt.Fprintf(&b, "skipped (%s):\n", firstLine(reason))
		for _, name := range skipped[reason] {
			fmt.Fprintf(&b, "  %s\n", name)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// placement counts the specs that recorded their pods' nodes, those
// whose pods ran on two or more nodes, and every node named.
func (s Summary) placement() (ran, spread int, nodes []string) {
	for _, r := range s.Results {
		if len(r.Nodes) == 0 {
			continue
		}
		ran++
		if len(r.Nodes) > 1 {
			spread++
		}
		for _, n := range r.Nodes {
			if !slices.Contains(nodes, n) {
				nodes = append(nodes, n)
			}
		}
	}
	slices.Sort(nodes)
	return ran, spread, nodes
}

// onNodes is " (pods on a, b)" for a progress line, "" without nodes.
func onNodes(nodes []string) string {
	if len(nodes) == 0 {
		return ""
	}
	return " (pods on " + strings.Join(nodes, ", ") + ")"
}

// firstLine is s up to its first line break, trimmed.
func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return strings.TrimSpace(s[:i]) + " ..."
	}
	return s
}

// resultOf turns a spec's report from a run into a Result.
func resultOf(s ginkgoSpecReport) Result {
	r := Result{Name: s.name(), RunTime: s.RunTime}
	switch s.State {
	case statePassed:
		r.Outcome = Passed
	case stateSkipped, statePending:
		r.Outcome = Skipped
		r.Reason = strings.TrimSpace(s.Failure.Message)
		if r.Reason == "" {
			r.Reason = "skipped by the suite"
		}
	default: // failed, panicked, timedout, aborted, interrupted
		r.Outcome = Failed
		r.Reason = fmt.Sprintf("%s: %s", s.State, strings.TrimSpace(s.Failure.Message))
		if loc := s.Failure.Location; loc.FileName != "" {
			r.Reason += fmt.Sprintf("\n  at %s:%d", loc.FileName, loc.LineNumber)
		}
	}
	return r
}
