package policy

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// TestGolden applies each testdata/*.yaml (policies separated by "---") to
// the cnpWorld cluster and compares every pod's computed policy, printed
// with EndpointPolicy.Format, to testdata/*.golden. Run with -update to
// rewrite the golden files after a deliberate change.
func TestGolden(t *testing.T) {
	files, err := filepath.Glob("testdata/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata: %v", err)
	}
	for _, file := range files {
		name := strings.TrimSuffix(filepath.Base(file), ".yaml")
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			w := cnpWorld(t, ModeDefault)
			var b strings.Builder
			b.WriteString("# identities:")
			keys := slices.Sorted(func(yield func(string) bool) {
				for k := range w.pods {
					if !yield(k) {
						return
					}
				}
			})
			for _, k := range keys {
				fmt.Fprintf(&b, " %s=%d", k, w.pods[k].Identity)
			}
			b.WriteString("\n")
			for _, doc := range strings.Split(string(data), "\n---\n") {
				for _, r := range w.apply(doc) {
					for _, warn := range r.Warnings {
						fmt.Fprintf(&b, "# warning: %s: %s\n", r.Source, warn)
					}
				}
			}
			var cidrs []string
			for p, id := range w.e.CIDRIdentities() {
				cidrs = append(cidrs, fmt.Sprintf("# cidr identity: %s=%d\n", p, id))
			}
			slices.Sort(cidrs)
			b.WriteString(strings.Join(cidrs, ""))
			for _, k := range keys {
				fmt.Fprintf(&b, "== %s (identity %s)\n", k, w.pods[k].Identity.StringID())
				b.WriteString(w.e.Compute(w.pods[k]).Format())
			}
			got := b.String()
			golden := strings.TrimSuffix(file, ".yaml") + ".golden"
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -update to create it)", err)
			}
			if got != string(want) {
				t.Errorf("%s differs from the computed policy (go test -update rewrites it):\n--- got\n%s\n--- want\n%s", golden, got, want)
			}
		})
	}
}
