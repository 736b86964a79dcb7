package labels

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
)

// Prefix is one rule of a Filter: labels of Source (any source when empty)
// whose key starts with Prefix are included, or excluded when Ignore is set.
// A Prefix from ParsePrefix matches a regular expression; one written as a
// struct literal matches its Prefix literally.
type Prefix struct {
	// Source restricts the rule to labels of this source; empty means any.
	Source string
	// Prefix is a regular expression that must match at the start of the
	// key, or, for rules read from a prefix file, a literal prefix.
	Prefix string
	// Ignore makes the rule exclude the labels it matches.
	Ignore bool

	re *regexp.Regexp // nil for a literal prefix
}

// ParsePrefix reads a rule in the form of the --labels option:
// "[source:][!]regexp". The regular expression must match at the start of a
// label's key; "!" turns the rule into an exclusion. Examples: "k8s:app"
// (include k8s labels whose key starts with "app"), "!pod-template-hash",
// "reserved:.*".
//
// Possible errors: an empty expression, an invalid regular expression.
func ParsePrefix(s string) (Prefix, error) {
	var p Prefix
	if i := strings.IndexByte(s, ':'); i >= 0 {
		p.Source, p.Prefix = s[:i], s[i+1:]
	} else {
		p.Prefix = s
	}
	if strings.HasPrefix(p.Prefix, "!") {
		p.Ignore = true
		p.Prefix = p.Prefix[1:]
	}
	if p.Prefix == "" {
		return Prefix{}, fmt.Errorf("label prefix %q: empty expression", s)
	}
	re, err := regexp.Compile(p.Prefix)
	if err != nil {
		return Prefix{}, fmt.Errorf("label prefix %q: %w", s, err)
	}
	p.re = re
	return p, nil
}

// String prints the rule in the form ParsePrefix reads.
func (p Prefix) String() string {
	s := p.Prefix
	if p.Ignore {
		s = "!" + s
	}
	if p.Source != "" {
		s = p.Source + ":" + s
	}
	return s
}

// match reports whether the rule matches l and how many bytes of the key
// the match covers. Ignore plays no part here.
func (p Prefix) match(l Label) (bool, int) {
	if p.Source != "" && p.Source != l.Source {
		return false, 0
	}
	if p.re == nil {
		return strings.HasPrefix(l.Key, p.Prefix), len(p.Prefix)
	}
	loc := p.re.FindStringIndex(l.Key)
	if loc == nil || loc[0] != 0 {
		return false, 0
	}
	return true, loc[1]
}

// Filter splits labels into identity-relevant and informational ones.
// A Filter is immutable and safe for concurrent use.
//
// Each label is checked against every rule. It is relevant if the longest
// match of an include rule is longer than the shortest match of an exclude
// rule, or, when the filter is not in allow-list mode, if no exclude rule
// matches at all. A filter is in allow-list mode when the user configured an
// include rule; then labels that no include rule matches are informational.
type Filter struct {
	prefixes  []Prefix
	allowList bool
}

// defaultPrefixes is the built-in rule list, in the --labels syntax.
func defaultPrefixes() []string {
	q := regexp.QuoteMeta
	return []string{
		// Included.
		SourceReserved + ":.*",
		q(PodNamespaceLabel),
		q(PodNamespaceMetaLabels),
		q(AppKubernetesPrefix),
		q(PolicyLabelCluster),
		q(PolicyLabelServiceAccount),
		// Excluded.
		"!" + q("io.kubernetes"),
		"!" + q("kubernetes.io"),
		"!" + q("statefulset.kubernetes.io/pod-name"),
		"!" + q("apps.kubernetes.io/pod-index"),
		"!" + q("batch.kubernetes.io/job-completion-index"),
		"!" + q("batch.kubernetes.io/controller-uid"),
		"!.*" + q("beta.kubernetes.io"), // anywhere in the key
		"!" + q("k8s.io"),
		"!" + q("pod-template-generation"),
		"!" + q("pod-template-hash"),
		"!" + q("controller-revision-hash"),
		"!" + q("controller-uid"),
		"!annotation.*",
		"!" + q("etcd_node"),
		"!" + q("topology.kubernetes.io"),
	}
}

// DefaultFilter returns the filter used when neither --labels nor
// --label-prefix-file is given. It keeps reserved labels, the namespace,
// namespace labels, app.kubernetes.io labels, cluster and service account,
// and drops Kubernetes-managed keys (io.kubernetes*, kubernetes.io*,
// *beta.kubernetes.io*, k8s.io*, pod-template-hash, controller-revision-hash,
// ...). Every other label is relevant.
func DefaultFilter() *Filter {
	f, err := NewFilter(nil)
	if err != nil {
		panic(fmt.Sprintf("default label filter: %v", err)) // the list is a constant
	}
	return f
}

// NewFilter returns the default rules followed by the user's --labels rules
// (see ParsePrefix; empty strings are skipped). Any include rule among them
// switches the filter to allow-list mode.
//
// Possible errors: a rule ParsePrefix rejects; the error names --labels.
func NewFilter(userPrefixes []string) (*Filter, error) {
	f := &Filter{}
	for _, s := range defaultPrefixes() {
		p, err := ParsePrefix(s)
		if err != nil {
			return nil, err
		}
		f.prefixes = append(f.prefixes, p)
	}
	if err := f.addUser(userPrefixes); err != nil {
		return nil, err
	}
	return f, nil
}

// NewFilterFromFile reads the rules of a --label-prefix-file, which replace
// the default rules, and appends the user's --labels rules. The file is JSON:
//
//	{"version": 1, "valid-prefixes": [
//	  {"source": "k8s", "prefix": "app", "invert": false}, ...]}
//
// Unlike --labels, the file's prefixes are literal prefixes, not regular
// expressions, and each needs a source. "invert" marks an exclude rule. An
// include rule in the file or in userPrefixes switches the filter to
// allow-list mode; in that mode remember to include {"source":"reserved"}
// rules, or reserved labels stop counting.
//
// Possible errors: malformed JSON, a version other than 1, an entry without
// prefix or source, a --labels rule ParsePrefix rejects.
func NewFilterFromFile(r io.Reader, userPrefixes []string) (*Filter, error) {
	var file struct {
		Version  int `json:"version"`
		Prefixes []struct {
			Source string `json:"source"`
			Prefix string `json:"prefix"`
			Invert bool   `json:"invert"`
		} `json:"valid-prefixes"`
	}
	if err := json.NewDecoder(r).Decode(&file); err != nil {
		return nil, fmt.Errorf("--label-prefix-file: %w", err)
	}
	if file.Version != 1 {
		return nil, fmt.Errorf("--label-prefix-file: unsupported version %d, want 1", file.Version)
	}
	f := &Filter{}
	for i, e := range file.Prefixes {
		if e.Prefix == "" || e.Source == "" {
			return nil, fmt.Errorf("--label-prefix-file: valid-prefixes[%d]: prefix and source must not be empty", i)
		}
		f.prefixes = append(f.prefixes, Prefix{Source: e.Source, Prefix: e.Prefix, Ignore: e.Invert})
		if !e.Invert {
			f.allowList = true
		}
	}
	if err := f.addUser(userPrefixes); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *Filter) addUser(userPrefixes []string) error {
	var errs []error
	for _, s := range userPrefixes {
		if s == "" {
			continue
		}
		p, err := ParsePrefix(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("--labels: %w", err))
			continue
		}
		f.prefixes = append(f.prefixes, p)
		if !p.Ignore {
			f.allowList = true
		}
	}
	return errors.Join(errs...)
}

// Prefixes returns the filter's rules in the order they were given.
func (f *Filter) Prefixes() []Prefix {
	return append([]Prefix(nil), f.prefixes...)
}

// AllowList reports whether only labels matched by an include rule are
// relevant.
func (f *Filter) AllowList() bool { return f.allowList }

// Relevant reports whether l counts for the identity.
func (f *Filter) Relevant(l Label) bool {
	included, ignored := 0, 0
	for _, p := range f.prefixes {
		ok, n := p.match(l)
		switch {
		case !ok:
		case p.Ignore:
			if ignored == 0 || n < ignored {
				ignored = n
			}
		case n > included:
			included = n
		}
	}
	return (!f.allowList && ignored == 0) || included > ignored
}

// Split returns the relevant labels of ls (the identity labels) and the
// others (informational labels, kept on the endpoint but not part of its
// identity).
func (f *Filter) Split(ls Labels) (identity, info Labels) {
	var id, rest []Label
	for _, l := range ls.lbls {
		if f.Relevant(l) {
			id = append(id, l)
		} else {
			rest = append(rest, l)
		}
	}
	return Labels{lbls: id}, Labels{lbls: rest}
}
