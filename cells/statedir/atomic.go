package statedir

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// WriteFile replaces the file at path with data so that a crash at any
// moment leaves either the old content or the new one, never a mix or an
// empty file: it writes a temporary file in the same directory, fsyncs it,
// renames it over path and fsyncs the directory, so that the rename itself
// survives a power loss. perm applies to a new file.
//
// Possible errors: the directory is not writable, the disk is full, or a
// sync failed; the message names the file.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	return writeFile(path, data, perm, (*os.File).Sync)
}

// writeFile is WriteFile with the sync call as a parameter, so that a test
// can see what is synced.
func writeFile(path string, data []byte, perm os.FileMode, sync func(*os.File) error) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+TempInfix+"*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // after a successful rename this fails harmlessly
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := sync(f); err != nil {
		f.Close()
		return fmt.Errorf("sync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("replace %s: %w", path, err)
	}
	return syncDir(dir, sync)
}

// TempInfix is part of the name of WriteFile's temporary files
// (".<name>.tmp-<random>"): a reader of a directory skips (or removes)
// files starting with "." and containing it; they are left over by a
// crash during a write.
const TempInfix = ".tmp-"

// IsTemp reports whether name (a base name) is one of WriteFile's
// temporary files.
func IsTemp(name string) bool {
	return strings.HasPrefix(name, ".") && strings.Contains(name, TempInfix)
}

// SyncDir fsyncs a directory, making the creation, rename or removal of
// its entries durable.
func SyncDir(dir string) error { return syncDir(dir, (*os.File).Sync) }

func syncDir(dir string, sync func(*os.File) error) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := sync(d); err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}
