package scale

import (
	"maps"
	"strconv"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/test/harness"
)

// The identities kvstore mode writes are what the agent's kvstore
// identity source reads back as the CiliumIdentities CRD mode creates;
// every identity with pods has a value key per node of its pods.
func TestKVStoreIdentities(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	e := harness.StartEtcd(t)
	cfg := clientv3.Config{Endpoints: []string{e.URL()}, DialTimeout: 10 * time.Second}
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	r := &runner{cfg: Config{Mode: ModeKVStore, Nodes: 4, Pods: 40, Identities: 6}, etcd: cli}
	for i := range r.cfg.Identities {
		if err := r.kvstoreIdentity(t.Context(), i); err != nil {
			t.Fatal(err)
		}
	}

	kv := kvstore.NewClient(harness.TextLogger(t.Output()), cfg, time.Minute)
	if err := kv.Start(); err != nil {
		t.Fatal(err)
	}
	defer kv.Close()
	obj, err := kv.IdentitiesListerWatcher(harness.TextLogger(t.Output())).(cache.ListerWithContext).ListWithContext(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string]string{}
	for _, id := range obj.(*ciliumv2.CiliumIdentityList).Items {
		got[id.Name] = id.SecurityLabels
	}
	if len(got) != r.cfg.Identities {
		t.Fatalf("the agent reads %d identities from etcd, want %d: %v", len(got), r.cfg.Identities, got)
	}
	for i := range r.cfg.Identities {
		want := ciliumIdentity(i)
		if !maps.Equal(got[want.Name], want.SecurityLabels) {
			t.Errorf("identity %s: labels %v, want the CRD's %v", want.Name, got[want.Name], want.SecurityLabels)
		}
	}

	// 40 pods, 10 per identity: identities 0-3 have pods, 4 and 5 none;
	// pod j is on node j%4 with identity j%4, so identity i's on node i.
	resp, err := cli.Get(t.Context(), kvstore.IdentityValuePrefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]bool{}
	for _, v := range resp.Kvs {
		values[string(v.Key)] = true
	}
	if len(values) != 4 {
		t.Errorf("%d value keys, want 4 (one per identity with pods): %v", len(values), values)
	}
	for i := range 4 {
		id := strconv.FormatInt(identityID(i), 10)
		key := kvstore.IdentityValueKey(labelsKeyOf(i), nodeIP(i).String())
		if !values[key] {
			t.Errorf("identity %s: no value key %s", id, key)
		}
	}
}
