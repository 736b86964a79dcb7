package api

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// TestGeneratedFilesAreFresh runs hack/update-codegen.sh on a copy of the
// module (go.mod, go.sum, hack/, api/) and fails if the regenerated api/ tree
// differs from the one in the working tree. The working tree is not touched.
func TestGeneratedFilesAreFresh(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the code generators (about a minute); skipped with -short")
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("bash not found; cannot run hack/update-codegen.sh")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go not found; cannot run the code generators")
	}

	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	for _, name := range []string{"go.mod", "go.sum", "hack", "api"} {
		if err := copyTree(filepath.Join(root, name), filepath.Join(work, name)); err != nil {
			t.Fatalf("copy %s: %v", name, err)
		}
	}

	cmd := exec.Command(bash, filepath.Join(work, "hack", "update-codegen.sh"))
	cmd.Dir = work
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/update-codegen.sh failed: %v\n%s", err, out)
	}

	want, err := readTree(filepath.Join(root, "api"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := readTree(filepath.Join(work, "api"))
	if err != nil {
		t.Fatal(err)
	}
	var problems []string
	for name, data := range got {
		old, ok := want[name]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("api/%s: generated but missing from the tree", name))
		case !bytes.Equal(old, data):
			problems = append(problems, fmt.Sprintf("api/%s: differs (%s)", name, firstDiff(old, data)))
		}
	}
	for name := range want {
		if _, ok := got[name]; !ok {
			problems = append(problems, fmt.Sprintf("api/%s: in the tree but no longer generated", name))
		}
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		t.Fatalf("generated files are stale; run hack/update-codegen.sh and commit the result:\n%s",
			strings.Join(problems, "\n"))
	}
}

// copyTree copies a file or a directory tree, keeping file modes.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, data, info.Mode().Perm())
	})
}

// readTree returns the regular files under dir, keyed by slash-separated
// relative path.
func readTree(dir string) (map[string][]byte, error) {
	files := map[string][]byte{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files[filepath.ToSlash(rel)] = data
		return nil
	})
	return files, err
}

// firstDiff describes the first line where a and b differ.
func firstDiff(a, b []byte) string {
	al := strings.Split(string(a), "\n")
	bl := strings.Split(string(b), "\n")
	for i := 0; i < len(al) || i < len(bl); i++ {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			return fmt.Sprintf("line %d: tree %q, generated %q", i+1, x, y)
		}
	}
	return "same lines, different bytes"
}
