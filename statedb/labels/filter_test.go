package labels

import (
	"strings"
	"testing"
)

func TestDefaultFilter(t *testing.T) {
	f := DefaultFilter()
	if f.AllowList() {
		t.Fatal("default filter is in allow-list mode")
	}
	tests := []struct {
		label string
		want  bool
	}{
		// Included by an explicit rule.
		{"reserved:host", true},
		{"reserved:anything", true},
		{"k8s:io.kubernetes.pod.namespace=default", true},
		{"container:io.kubernetes.pod.namespace=default", true}, // rules without source match any source
		{"k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=default", true},
		{"k8s:io.cilium.k8s.namespace.labels.team=a", true},
		{"k8s:app.kubernetes.io/name=web", true},
		{"k8s:io.cilium.k8s.policy.cluster=default", true},
		{"k8s:io.cilium.k8s.policy.serviceaccount=sa", true},
		// Not matched by any rule: relevant.
		{"k8s:app=web", true},
		{"k8s:tier=frontend", true},
		{"k8s:ioXkubernetes=x", true},       // "." in the rules is escaped
		{"k8s:my.kubernetes.io/x=y", true},  // kubernetes.io must start the key
		{"k8s:example.com/k8s.io=y", true},  // k8s.io must start the key
		{"k8s:controller-revision=x", true}, // shorter than the excluded key
		{"k8s:xpod-template-hash=1", true},  // not at the start
		// Excluded.
		{"k8s:io.kubernetes.pod.name=web-1", false},
		{"k8s:io.kubernetes.container.name=c", false},
		{"k8s:kubernetes.io/hostname=n1", false},
		{"k8s:statefulset.kubernetes.io/pod-name=web-0", false},
		{"k8s:apps.kubernetes.io/pod-index=0", false},
		{"k8s:batch.kubernetes.io/job-completion-index=3", false},
		{"k8s:batch.kubernetes.io/controller-uid=u", false},
		{"k8s:beta.kubernetes.io/arch=amd64", false},
		{"k8s:failure-domain.beta.kubernetes.io/zone=z", false}, // anywhere in the key
		{"k8s:k8s.io/foo=bar", false},
		{"k8s:pod-template-generation=1", false},
		{"k8s:pod-template-hash=5d8f", false},
		{"k8s:controller-revision-hash=abc", false},
		{"k8s:controller-uid=u", false},
		{"k8s:annotation.kubernetes.io/config.seen=t", false},
		{"k8s:annotation=x", false},
		{"k8s:etcd_node=n", false},
		{"k8s:topology.kubernetes.io/zone=z", false},
		{"container:pod-template-hash=1", false},
	}
	for _, tt := range tests {
		if got := f.Relevant(Parse(tt.label)); got != tt.want {
			t.Errorf("Relevant(%s) = %v, want %v", tt.label, got, tt.want)
		}
	}
}

func TestFilterUserPrefixes(t *testing.T) {
	tests := []struct {
		name      string
		prefixes  []string
		allowList bool
		relevant  []string
		dropped   []string
	}{
		{
			name:      "exclude rules only keep default mode",
			prefixes:  []string{"!version", "k8s:!rollout.*"},
			allowList: false,
			relevant:  []string{"k8s:app=web", "container:rollout-id=1"},
			dropped:   []string{"k8s:version=2", "k8s:rollout-id=1", "k8s:pod-template-hash=x"},
		},
		{
			// Cilium's documented example: an allow list of four prefixes.
			name:      "include rules switch to allow-list mode",
			prefixes:  []string{"k8s:io.kubernetes.pod.namespace", "k8s:k8s-app", "k8s:app", "k8s:name"},
			allowList: true,
			relevant: []string{
				"k8s:k8s-app-team=foo", "k8s:app-production=foo", "k8s:name-defined=foo",
				"reserved:host", "any:io.kubernetes.pod.namespace=docker",
				"k8s:io.cilium.k8s.namespace.labels=foo", // default include rule
			},
			dropped: []string{"container:k8s-app-role=foo", "k8s:tier=db", "k8s:version=1"},
		},
		{
			name:      "longer include beats shorter exclude",
			prefixes:  []string{"io.kubernetes.pod.name"},
			allowList: true,
			relevant:  []string{"k8s:io.kubernetes.pod.name=web-1"},
			dropped:   []string{"k8s:io.kubernetes.container.name=c"},
		},
		{
			name:      "empty strings are skipped",
			prefixes:  []string{"", ""},
			allowList: false,
			relevant:  []string{"k8s:app=web"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := NewFilter(tt.prefixes)
			if err != nil {
				t.Fatal(err)
			}
			if f.AllowList() != tt.allowList {
				t.Errorf("AllowList() = %v, want %v", f.AllowList(), tt.allowList)
			}
			for _, s := range tt.relevant {
				if !f.Relevant(Parse(s)) {
					t.Errorf("%s is not relevant", s)
				}
			}
			for _, s := range tt.dropped {
				if f.Relevant(Parse(s)) {
					t.Errorf("%s is relevant", s)
				}
			}
		})
	}
}

func TestNewFilterErrors(t *testing.T) {
	for _, p := range []string{"k8s:[", "!", "k8s:", "k8s:!"} {
		_, err := NewFilter([]string{p})
		if err == nil {
			t.Errorf("NewFilter(%q) succeeded", p)
			continue
		}
		if !strings.Contains(err.Error(), "--labels") {
			t.Errorf("NewFilter(%q) error %q does not name the flag", p, err)
		}
	}
}

func TestParsePrefixRoundTrip(t *testing.T) {
	for _, s := range []string{"k8s:app", "!pod-template-hash", "reserved:.*", "k8s:!rollout.*", `io\.kubernetes`} {
		p, err := ParsePrefix(s)
		if err != nil {
			t.Fatal(err)
		}
		if p.String() != s {
			t.Errorf("ParsePrefix(%q).String() = %q", s, p.String())
		}
	}
}

func TestDefaultFilterPrefixes(t *testing.T) {
	var got []string
	for _, p := range DefaultFilter().Prefixes() {
		got = append(got, p.String())
	}
	want := []string{
		`reserved:.*`,
		`io\.kubernetes\.pod\.namespace`,
		`io\.cilium\.k8s\.namespace\.labels`,
		`app\.kubernetes\.io`,
		`io\.cilium\.k8s\.policy\.cluster`,
		`io\.cilium\.k8s\.policy\.serviceaccount`,
		`!io\.kubernetes`,
		`!kubernetes\.io`,
		`!statefulset\.kubernetes\.io/pod-name`,
		`!apps\.kubernetes\.io/pod-index`,
		`!batch\.kubernetes\.io/job-completion-index`,
		`!batch\.kubernetes\.io/controller-uid`,
		`!.*beta\.kubernetes\.io`,
		`!k8s\.io`,
		`!pod-template-generation`,
		`!pod-template-hash`,
		`!controller-revision-hash`,
		`!controller-uid`,
		`!annotation.*`,
		`!etcd_node`,
		`!topology\.kubernetes\.io`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("default prefixes =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestNewFilterFromFile(t *testing.T) {
	file := `{"version": 1, "valid-prefixes": [
		{"source": "reserved", "prefix": ""},
		{"source": "k8s", "prefix": "app"},
		{"source": "k8s", "prefix": "app.kubernetes.io/version", "invert": true},
		{"source": "k8s", "prefix": "io.kubernetes.pod.namespace"}
	]}`
	if _, err := NewFilterFromFile(strings.NewReader(file), nil); err == nil {
		t.Fatal("a prefix file entry with an empty prefix was accepted")
	}
	file = strings.Replace(file, `"prefix": ""`, `"prefix": "h"`, 1)
	f, err := NewFilterFromFile(strings.NewReader(file), []string{"!k8s:x"})
	if err != nil {
		t.Fatal(err)
	}
	if !f.AllowList() {
		t.Error("file with include rules is not an allow list")
	}
	for s, want := range map[string]bool{
		"reserved:host":                      true,
		"reserved:world":                     false, // only "h..." included
		"k8s:app=web":                        true,
		"k8s:app.kubernetes.io/name=web":     true,
		"k8s:app.kubernetes.io/version=1":    false, // longer exclude
		"container:app=web":                  false, // wrong source
		"k8s:io.kubernetes.pod.namespace=ns": true,
		"k8s:tier=db":                        false,
		"k8s:ap.p=x":                         false, // file prefixes are literal, "." is not a wildcard
	} {
		if got := f.Relevant(Parse(s)); got != want {
			t.Errorf("Relevant(%s) = %v, want %v", s, got, want)
		}
	}

	for _, bad := range []string{
		`{"version": 2, "valid-prefixes": []}`,
		`{"version": 1, "valid-prefixes": [{"prefix": "app"}]}`,
		`not json`,
	} {
		_, err := NewFilterFromFile(strings.NewReader(bad), nil)
		if err == nil || !strings.Contains(err.Error(), "--label-prefix-file") {
			t.Errorf("NewFilterFromFile(%s) error = %v, want one naming --label-prefix-file", bad, err)
		}
	}
}

func TestSplitKeepsEveryLabel(t *testing.T) {
	all := ParseLabels("k8s:app=web", "k8s:pod-template-hash=1", "reserved:host", "k8s:io.kubernetes.pod.name=p")
	id, info := DefaultFilter().Split(all)
	if id.String() != "k8s:app=web,reserved:host" {
		t.Errorf("identity = %v", id)
	}
	if info.String() != "k8s:io.kubernetes.pod.name=p,k8s:pod-template-hash=1" {
		t.Errorf("info = %v", info)
	}
	if !id.Merge(info).Equal(all) {
		t.Error("Split lost labels")
	}
}
