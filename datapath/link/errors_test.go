package link

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
)

// These need no privileges: every call fails before it changes anything.

func TestNetnsNotFound(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{filepath.Join(dir, "missing"), file} {
		if _, err := openNetns(path); !errors.Is(err, ErrNetnsNotFound) {
			t.Errorf("openNetns(%s) = %v, want ErrNetnsNotFound", path, err)
		}
		h := Host{NetnsPath: path}
		if _, err := h.ListHostInterfaces(); !errors.Is(err, ErrNetnsNotFound) {
			t.Errorf("ListHostInterfaces with host netns %s = %v, want ErrNetnsNotFound", path, err)
		}
		if err := h.EnsurePodRoute(context.Background(), "lxc1", net.IPv4(10, 0, 0, 1)); !errors.Is(err, ErrNetnsNotFound) {
			t.Errorf("EnsurePodRoute with host netns %s = %v, want ErrNetnsNotFound", path, err)
		}
		spec := validSpec()
		spec.NetnsPath = path
		if _, err := h.SetupEndpoint(context.Background(), spec); !errors.Is(err, ErrNetnsNotFound) {
			t.Errorf("SetupEndpoint with host netns %s = %v, want ErrNetnsNotFound", path, err)
		}
	}
}

func TestInvalidArguments(t *testing.T) {
	ctx := context.Background()
	h := Host{NetnsPath: filepath.Join(t.TempDir(), "never-opened")}
	spec := validSpec()
	spec.IPv4 = nil
	if _, err := h.SetupEndpoint(ctx, spec); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("SetupEndpoint = %v, want ErrInvalidSpec", err)
	}
	if err := h.CheckEndpoint(ctx, spec); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("CheckEndpoint = %v, want ErrInvalidSpec", err)
	}
	if err := h.RemoveEndpoint(ctx, "", ""); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("RemoveEndpoint = %v, want ErrInvalidSpec", err)
	}
	if err := h.EnsurePodRoute(ctx, "lxc1", nil); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("EnsurePodRoute = %v, want ErrInvalidSpec", err)
	}
	if err := h.DeletePodRoute(ctx, "lxc/1", net.IPv4(10, 0, 0, 1)); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("DeletePodRoute = %v, want ErrInvalidSpec", err)
	}
}
