package soak

import (
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"k8s.io/client-go/tools/cache"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
)

// identityWatch checks continuously that no CiliumIdentity is deleted
// while a CEP uses it. At a deletion it notes the CEPs that carry the
// identity (suspects); a later update of a suspect to another identity,
// or its deletion, clears it, since the CEP may just have lagged behind
// its endpoint. A suspect still carrying the identity at the next
// quiescent point, its pod alive, is a violation: the identity was
// deleted from under a running pod.
type identityWatch struct {
	tl   *Timeline
	wake func()

	mu        sync.Mutex
	ceps      map[string]cepRef  // by CEP UID, as last seen
	suspects  map[string]suspect // by CEP UID
	deletions int
}

type cepRef struct {
	name     string
	identity int64
}

type suspect struct {
	cep      string
	identity int64
	at       time.Duration
}

func newIdentityWatch(tl *Timeline, wake func()) *identityWatch {
	return &identityWatch{tl: tl, wake: wake, ceps: map[string]cepRef{}, suspects: map[string]suspect{}}
}

func cepIdentity(c *ciliumv2.CiliumEndpoint) int64 {
	if c.Status.Identity == nil {
		return 0
	}
	return c.Status.Identity.ID
}

// cepHandler follows the soak namespace's CEPs.
func (w *identityWatch) cepHandler() cache.ResourceEventHandler {
	set := func(obj any) {
		c, ok := obj.(*ciliumv2.CiliumEndpoint)
		if !ok {
			return
		}
		id := cepIdentity(c)
		w.mu.Lock()
		w.ceps[string(c.UID)] = cepRef{name: c.Name, identity: id}
		if s, ok := w.suspects[string(c.UID)]; ok && s.identity != id {
			delete(w.suspects, string(c.UID))
		}
		w.mu.Unlock()
		w.wake()
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    set,
		UpdateFunc: func(_, obj any) { set(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			c, ok := obj.(*ciliumv2.CiliumEndpoint)
			if !ok {
				return
			}
			w.mu.Lock()
			delete(w.ceps, string(c.UID))
			delete(w.suspects, string(c.UID))
			w.mu.Unlock()
			w.wake()
		},
	}
}

// identityHandler notes identity deletions.
func (w *identityWatch) identityHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			c, ok := obj.(*ciliumv2.CiliumIdentity)
			if !ok {
				return
			}
			id, err := strconv.ParseInt(c.Name, 10, 64)
			if err != nil {
				return
			}
			w.deleted(id)
		},
	}
}

// deleted records the deletion of identity id.
func (w *identityWatch) deleted(id int64) {
	at := w.tl.Elapsed()
	w.mu.Lock()
	w.deletions++
	var users []string
	for uid, ref := range w.ceps {
		if ref.identity == id {
			users = append(users, ref.name)
			w.suspects[uid] = suspect{cep: ref.name, identity: id, at: at}
		}
	}
	w.mu.Unlock()
	slices.Sort(users)
	if len(users) > 0 {
		w.tl.Addf("identity-gc", "CiliumIdentity %d deleted while CEPs %v carry it (checked at the next quiescent point)", id, users)
	} else {
		w.tl.Addf("identity-gc", "CiliumIdentity %d deleted (unused)", id)
	}
}

// check returns a violation for each suspect that still carries the
// deleted identity in s while its pod is alive, and forgets every
// suspect.
func (w *identityWatch) check(s *Snapshot, alive map[string]bool) []Violation {
	w.mu.Lock()
	suspects := w.suspects
	w.suspects = map[string]suspect{}
	w.mu.Unlock()
	var out []Violation
	for uid, sus := range suspects {
		for _, cep := range s.CEPs {
			if cep.UID == uid && cep.Identity == sus.identity && alive[cep.Name] {
				out = append(out, Violation{
					Invariant: "identity-deleted-in-use",
					Object:    "identity " + strconv.FormatInt(sus.identity, 10),
					Message: fmt.Sprintf("its CiliumIdentity was deleted at %s while CEP %s (a live pod) carried it, and still does",
						sus.at.Truncate(time.Millisecond), sus.cep),
				})
			}
		}
	}
	return out
}

// Deletions is how many identity deletions were seen.
func (w *identityWatch) Deletions() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.deletions
}
