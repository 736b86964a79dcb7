package k8s_test

import (
	"slices"
	"testing"

	"github.com/cilium/statedb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/labels"
)

// The CiliumIdentity table finds identities by label set, whatever the
// order of the labels in the object, and lists each duplicate.
func TestCiliumIdentityLabelsIndex(t *testing.T) {
	db := statedb.New()
	table, err := k8stables.NewCiliumIdentitiesTable(db)
	if err != nil {
		t.Fatal(err)
	}
	cid := func(name string, sec map[string]string) *ciliumv2.CiliumIdentity {
		return &ciliumv2.CiliumIdentity{ObjectMeta: metav1.ObjectMeta{Name: name}, SecurityLabels: sec}
	}
	web := map[string]string{"k8s:app": "web", "k8s:io.kubernetes.pod.namespace": "default"}
	txn := db.WriteTxn(table)
	for _, c := range []*ciliumv2.CiliumIdentity{
		cid("1000", web),
		cid("1001", map[string]string{"k8s:io.kubernetes.pod.namespace": "default", "k8s:app": "web"}),
		cid("1002", map[string]string{"k8s:app": "db", "k8s:io.kubernetes.pod.namespace": "default"}),
	} {
		if _, _, err := table.Insert(txn, c); err != nil {
			t.Fatal(err)
		}
	}
	rtxn := txn.Commit()

	key := labels.FromMap(web, "").SortedList()
	if got := k8stables.CiliumIdentityLabelsKey(cid("x", web)); got != key {
		t.Errorf("CiliumIdentityLabelsKey = %q, want %q", got, key)
	}
	var names []string
	for c := range table.List(rtxn, k8stables.CiliumIdentityLabelsIndex.Query(key)) {
		names = append(names, c.Name)
	}
	if want := []string{"1000", "1001"}; !slices.Equal(names, want) {
		t.Errorf("identities with the web labels = %v, want %v", names, want)
	}
	if _, _, found := table.Get(rtxn, k8stables.CiliumIdentityLabelsIndex.Query(labels.FromMap(map[string]string{"k8s:app": "none"}, "").SortedList())); found {
		t.Error("found an identity for labels no object has")
	}
}
