package devkubelet

import (
	"math"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// maxTimings bounds the timings kept; beyond it those of pods already
// torn down are dropped.
const maxTimings = 100_000

// PodTiming is what the kubelet measured for one pod (one UID).
type PodTiming struct {
	Namespace, Name string
	UID             types.UID
	// Seen is when the kubelet first synced the pod.
	Seen time.Time
	// Add is how long the successful CNI ADD took (plugin exec included);
	// AddErrors counts the failed ones before it.
	Add       time.Duration
	AddErrors int
	// Running is when the kubelet wrote the Running status.
	Running time.Time
	// Del is how long the CNI DEL of the pod's sandbox took; Gone is when
	// the sandbox was removed. Both zero until then.
	Del  time.Duration
	Gone time.Time
}

func (k *Kubelet) noteSeen(pod *corev1.Pod) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.timings[pod.UID] != nil {
		return
	}
	if len(k.timings) >= maxTimings {
		for uid, t := range k.timings {
			if !t.Gone.IsZero() {
				delete(k.timings, uid)
			}
		}
	}
	k.timings[pod.UID] = &PodTiming{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, Seen: time.Now()}
}

func (k *Kubelet) noteAdd(uid types.UID, d time.Duration, err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	t := k.timings[uid]
	if t == nil {
		return
	}
	if err != nil {
		t.AddErrors++
		return
	}
	t.Add = d
}

func (k *Kubelet) noteRunning(uid types.UID) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if t := k.timings[uid]; t != nil && t.Running.IsZero() {
		t.Running = time.Now()
	}
}

// Timings returns a copy of the per-pod timings, in the order the pods
// were first seen.
func (k *Kubelet) Timings() []PodTiming {
	k.mu.Lock()
	out := make([]PodTiming, 0, len(k.timings))
	for _, t := range k.timings {
		out = append(out, *t)
	}
	k.mu.Unlock()
	slices.SortFunc(out, func(a, b PodTiming) int { return a.Seen.Compare(b.Seen) })
	return out
}

// Percentile returns the p-th percentile (0 < p <= 100, nearest rank) of
// ds, or 0 for none. ds is not modified.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(math.Ceil(float64(len(s))*p/100)) - 1
	rank = max(0, min(rank, len(s)-1))
	return s[rank]
}
