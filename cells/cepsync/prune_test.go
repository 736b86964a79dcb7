package cepsync

import (
	"context"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/cilium/statedb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/cilium.io/v2alpha1"
	"github.com/cellium/cellium/api/client/clientset/versioned/fake"
	"github.com/cellium/cellium/statedb/endpoints"
	k8stables "github.com/cellium/cellium/statedb/k8s"
)

// Prune keeps the CEPs of endpoints that exist without a desired CEP: a
// restored endpoint still pending its identity (matched by name), and the
// placeholder of an endpoint whose state file was unreadable (matched by
// endpoint ID); it deletes the others of this node.
func TestPruneKeepsPendingEndpointsCEPs(t *testing.T) {
	t.Run("CiliumEndpoints", func(t *testing.T) { testPruneKeepsPending(t, false) })
	// With --enable-cilium-endpoint-slice the table holds what the slices
	// keep (no UID, no endpoint ID): Prune reads the real CEPs.
	t.Run("CiliumEndpointSlices", func(t *testing.T) { testPruneKeepsPending(t, true) })
}

func testPruneKeepsPending(t *testing.T, fromSlices bool) {
	const nodeIP = "192.0.2.10"
	cep := func(name string, id int64) *ciliumv2.CiliumEndpoint {
		return &ciliumv2.CiliumEndpoint{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)},
			Status:     ciliumv2.EndpointStatus{ID: id, Networking: &ciliumv2.EndpointNetworking{NodeIP: nodeIP}},
		}
	}
	objs := []*ciliumv2.CiliumEndpoint{cep("restoring", 1), cep("quarantined", 2), cep("stale", 3)}

	db := statedb.New()
	cepTable, err := k8stables.NewCiliumEndpointsTable(db)
	if err != nil {
		t.Fatal(err)
	}
	epTable, err := endpoints.NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Start(); err != nil {
		t.Fatal(err)
	}
	defer db.Stop()
	client := fake.NewSimpleClientset()
	txn := db.WriteTxn(cepTable, epTable)
	for _, c := range objs {
		row := c
		if fromSlices {
			core := v2alpha1.CoreFromCiliumEndpoint(c)
			row = core.CiliumEndpoint(c.Namespace)
		}
		cepTable.Insert(txn, row)
		if _, err := client.CiliumV2().CiliumEndpoints("ns").Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Restored, identity not resolved yet: no desired CEP.
	epTable.Insert(txn, &endpoints.Endpoint{ID: 1, PodNamespace: "ns", PodName: "restoring", CEPNamespace: "ns", CEPName: "restoring",
		IPv4: netip.MustParseAddr("10.0.0.1"), State: ciliumv2.EndpointStateRestoring})
	// The placeholder of ID 2: nothing known but the ID.
	epTable.Insert(txn, &endpoints.Endpoint{ID: 2, State: ciliumv2.EndpointStateInvalid})
	txn.Commit()

	tg := &target{log: slog.New(slog.DiscardHandler), client: client, db: db, ceps: cepTable,
		nodeIP: func() string { return nodeIP }, healthName: "cilium-health-n", uids: map[string]types.UID{}, endpoints: epTable}
	noDesired := func(func(*DesiredCEP, statedb.Revision) bool) {}
	if err := tg.Prune(context.Background(), db.ReadTxn(), noDesired); err != nil {
		t.Fatal(err)
	}
	list, err := client.CiliumV2().CiliumEndpoints("ns").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, c := range list.Items {
		left = append(left, c.Name)
	}
	if len(left) != 2 || left[0] != "quarantined" || left[1] != "restoring" {
		t.Fatalf("CEPs left after prune: %v, want quarantined and restoring", left)
	}
}
