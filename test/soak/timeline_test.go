package soak

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
)

var timeZero = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

func cepObject(name, uid string, identity int64) *ciliumv2.CiliumEndpoint {
	return &ciliumv2.CiliumEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(uid)},
		Status:     ciliumv2.EndpointStatus{Identity: &ciliumv2.EndpointIdentity{ID: identity}},
	}
}

func TestTimelineRing(t *testing.T) {
	now := timeZero
	tl := NewTimeline(3, timeZero, func() time.Time { return now })
	for i := range 5 {
		now = now.Add(time.Second)
		tl.Addf("step", "action %d", i)
	}
	kept, dropped := tl.Entries()
	if dropped != 2 || len(kept) != 3 || kept[0].What != "action 2" || kept[2].What != "action 4" || kept[0].At != 3*time.Second {
		t.Fatalf("Entries = %v, dropped %d; want actions 2..4 at 3s..5s, 2 dropped", kept, dropped)
	}
	var b strings.Builder
	if _, err := tl.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if !strings.HasPrefix(out, "(2 older entries dropped)\n") || !strings.Contains(out, "5s  step            action 4\n") {
		t.Errorf("WriteTo:\n%s", out)
	}
}
