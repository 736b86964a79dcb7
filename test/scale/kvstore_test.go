package scale

import (
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/cells/kvstoresync"
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
	r := &runner{cfg: Config{Mode: ModeKVStore, Nodes: 4, Pods: 40, Identities: 6, Concurrency: 4}, etcd: cli}
	if err := r.grantLeases(t.Context()); err != nil {
		t.Fatal(err)
	}
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
		if v.Lease == 0 {
			t.Errorf("value key %s has no lease", v.Key)
		}
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
		// Identity i's pods are on node i: its value key has node i's
		// session lease.
		v, err := cli.Get(t.Context(), key)
		if err != nil || len(v.Kvs) != 1 || clientv3.LeaseID(v.Kvs[0].Lease) != r.leases[i] {
			t.Errorf("identity %s: value key %v (%v), want node %d's lease %x", id, v, err, i, r.leases[i])
		}
	}
}

// What kvstore mode writes for a node and a pod is what a cellium (and a
// Cilium) agent writes, byte for byte, and the agent's kvstore reader
// (cells/kvstoresync, the decoder its mirrors use) reads it back as the
// same node and endpoint as their CiliumNode and CiliumEndpoint.
func TestKVStoreKeyFormat(t *testing.T) {
	p := remotePod{name: "pod-0000007", node: 3, identity: 12, ip: netip.MustParseAddr("10.1.3.9")}
	key, v, err := p.ipcacheKV()
	if err != nil {
		t.Fatal(err)
	}
	if key != "cilium/state/ip/v1/default/10.1.3.9" {
		t.Errorf("ipcache key %s", key)
	}
	// Cilium's IPIdentityPair JSON, as the agent's writer
	// (cells/kvstoresync) puts it for a pod without named ports.
	const wantIP = `{"IP":"10.1.3.9","Mask":null,"HostIP":"100.64.0.4","ID":10012,"Key":0,` +
		`"Metadata":"cilium-global:default:scale-node-00003:10","K8sNamespace":"scale-2","K8sPodName":"pod-0000007","K8sServiceAccount":"default"}`
	if string(v) != wantIP {
		t.Errorf("ipcache value\n got %s\nwant %s", v, wantIP)
	}
	e, err := kvstoresync.ParseIPEntry(key, v, 1)
	if err != nil {
		t.Fatalf("the agent rejects the ipcache key: %v", err)
	}
	cep := p.ciliumEndpoint()
	if e.Prefix != netip.PrefixFrom(p.ip, 32) || int64(e.Identity) != cep.Status.Identity.ID ||
		e.HostIP.String() != cep.Status.Networking.NodeIP || e.Namespace != cep.Namespace || e.PodName != cep.Name ||
		e.Metadata != kvstore.EndpointMetadata(nodeName(3), uint16(cep.Status.ID)) {
		t.Errorf("the agent reads %+v; the pod's CiliumEndpoint says %s/%s %v identity %d on %s",
			e, cep.Namespace, cep.Name, cep.Status.Networking.Addressing, cep.Status.Identity.ID, cep.Status.Networking.NodeIP)
	}

	key, v, err = kvNode(3)
	if err != nil {
		t.Fatal(err)
	}
	if key != "cilium/state/nodes/v1/default/scale-node-00003" {
		t.Errorf("node key %s", key)
	}
	// Cilium's Node JSON (Go field names), as the agent's node publisher
	// (cells/nodediscovery) puts it for a node with only an InternalIP.
	const wantNode = `{"Name":"scale-node-00003","Cluster":"default","IPAddresses":[{"Type":"InternalIP","IP":"100.64.0.4"}],` +
		`"IPv4AllocCIDR":{"IP":"10.1.3.0","Mask":"////AA=="},"IPv4SecondaryAllocCIDRs":null,"IPv6AllocCIDR":null,"IPv6SecondaryAllocCIDRs":null,` +
		`"IPv4HealthIP":"","IPv6HealthIP":"","IPv4IngressIP":"","IPv6IngressIP":"","ClusterID":0,"Source":"local","EncryptionKey":0,` +
		`"Labels":null,"Annotations":null,"WireguardPubKey":"","BootID":""}`
	if string(v) != wantNode {
		t.Errorf("node value\n got %s\nwant %s", v, wantNode)
	}
	n, err := kvstoresync.ParseNode(key, v, 1)
	if err != nil {
		t.Fatalf("the agent rejects the node key: %v", err)
	}
	cn := ciliumNode(3)
	if n.Name != cn.Name || n.Cluster != "default" || len(n.Addresses) != 1 ||
		string(n.Addresses[0].Type) != string(cn.Spec.Addresses[0].Type) || n.Addresses[0].IP.String() != cn.Spec.Addresses[0].IP ||
		len(n.PodCIDRs) != 1 || n.PodCIDRs[0].String() != cn.Spec.IPAM.PodCIDRs[0] {
		t.Errorf("the agent reads %+v; the CiliumNode says %+v", n, cn.Spec)
	}
}

// The node and ipcache keys go to etcd with their node's session lease
// (kept alive), are read back by the agent's decoder, and the churn's
// delete removes a pod's key.
func TestKVStoreNodeAndIPCacheKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	e := harness.StartEtcd(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.URL()}, DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	r := &runner{cfg: Config{Mode: ModeKVStore, Nodes: 3, Pods: 6, Identities: 2, Concurrency: 4}, etcd: cli}
	if err := r.grantLeases(t.Context()); err != nil {
		t.Fatal(err)
	}
	for n := range r.cfg.Nodes {
		if err := r.putNodeKey(t.Context(), n); err != nil {
			t.Fatal(err)
		}
	}
	pool := newAddressPool(r.cfg.Nodes)
	var pods []remotePod
	for j := range r.cfg.Pods {
		ip, err := pool.get(j % r.cfg.Nodes)
		if err != nil {
			t.Fatal(err)
		}
		p := remotePod{name: r.podName(), node: j % r.cfg.Nodes, identity: j % 2, ip: ip}
		pods = append(pods, p)
		if err := r.putIPCacheKey(t.Context(), p); err != nil {
			t.Fatal(err)
		}
	}

	nodesResp, err := cli.Get(t.Context(), kvstore.NodesPrefix+"/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(nodesResp.Kvs) != r.cfg.Nodes {
		t.Errorf("%d node keys, want %d", len(nodesResp.Kvs), r.cfg.Nodes)
	}
	for _, kv := range nodesResp.Kvs {
		n, err := kvstoresync.ParseNode(string(kv.Key), kv.Value, kv.ModRevision)
		if err != nil {
			t.Errorf("node key %s: %v", kv.Key, err)
			continue
		}
		i := slices.IndexFunc(r.leases, func(l clientv3.LeaseID) bool { return l == clientv3.LeaseID(kv.Lease) })
		if i < 0 || nodeName(i) != n.Name {
			t.Errorf("node key %s has lease %x, not its node's (%v)", kv.Key, kv.Lease, r.leases)
		}
	}
	ipResp, err := cli.Get(t.Context(), kvstore.IPKeysPrefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	got := map[netip.Addr]int64{}
	for _, kv := range ipResp.Kvs {
		e, err := kvstoresync.ParseIPEntry(string(kv.Key), kv.Value, kv.ModRevision)
		if err != nil {
			t.Errorf("ipcache key %s: %v", kv.Key, err)
			continue
		}
		got[e.Prefix.Addr()] = int64(e.Identity)
		if kv.Lease == 0 {
			t.Errorf("ipcache key %s has no lease", kv.Key)
		}
	}
	for _, p := range pods {
		if got[p.ip] != identityID(p.identity) {
			t.Errorf("pod %s %s: identity %d in etcd, want %d", p.name, p.ip, got[p.ip], identityID(p.identity))
		}
	}
	// The leases are alive, with Cilium's default TTL.
	ttl, err := cli.TimeToLive(t.Context(), r.leases[0])
	if err != nil || ttl.TTL <= 0 || ttl.GrantedTTL != int64(kvstore.DefaultLeaseTTL.Seconds()) {
		t.Errorf("node 0's lease: %+v, %v", ttl, err)
	}

	if err := r.deleteIPCacheKey(t.Context(), pods[0]); err != nil {
		t.Fatal(err)
	}
	if resp, err := cli.Get(t.Context(), kvstore.IPKey(pods[0].ip)); err != nil || len(resp.Kvs) != 0 {
		t.Errorf("deleted pod's key: %v, %v", resp.Kvs, err)
	}
}
