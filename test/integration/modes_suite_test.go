package integration

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	api "github.com/cellium/cellium/api/policy"
	"github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/test/controlplane"
)

// TestModes runs the endpoint, identity, policy and multi-node checks in
// each mode of testModes (the whole {CEP, CES} × {CRD, kvstore} matrix
// with CELLIUM_TEST_MODES=all, as make test-modes does): an operator and
// two agents on the real API server, with the credentials install/ gives
// them, pods made through the agents' API as the CNI plugin makes them,
// the datapath's maps in memory. What differs between the modes is where
// an assertion looks: a CiliumIdentity object or etcd's
// cilium/state/identities/v1 keys; CiliumEndpoints or slices.
func TestModes(t *testing.T) {
	for i, m := range testModes(t) {
		t.Run(m.String(), func(t *testing.T) {
			mc := startModeCluster(t, m, i)
			a, b := mc.agents[0], mc.agents[1]
			var web, client, web2 *podEndpoint
			var webID, clientID int64

			t.Run("endpoints", func(t *testing.T) {
				web = mc.addPod(t, a, "web", map[string]string{"app": "web"})
				client = mc.addPod(t, b, "client", map[string]string{"app": "client"})
				webID = mc.checkCEP(t, web)
				clientID = mc.checkCEP(t, client)
				if webID == clientID {
					t.Fatalf("web and client share identity %d", webID)
				}
				mc.checkSlices(t, map[string]int64{"web": webID, "client": clientID})
			})
			if t.Failed() {
				return
			}

			t.Run("identities", func(t *testing.T) {
				for _, p := range []struct {
					ep *podEndpoint
					id int64
				}{{web, webID}, {client, clientID}} {
					labels := mc.checkIdentityLabels(t, p.id, "k8s:app="+p.ep.name, "k8s:io.kubernetes.pod.namespace="+mc.ns)
					mc.checkIdentityStored(t, p.id, labels)
					mc.checkIdentityUsers(t, p.id, labels, p.ep.on)
				}
			})

			if mc.crd() && mc.kvstore() {
				t.Run("migration", func(t *testing.T) {
					// An identity that only the backend being read holds
					// (made before the migration began) is used as it is
					// and written to the other backend with its number.
					labels := slices.Clone(mc.checkIdentityLabels(t, webID))
					labels[slices.Index(labels, "k8s:app=web")] = "k8s:app=legacy"
					slices.Sort(labels)
					legacyID := 50000 + i
					mc.createInReadBackend(t, legacyID, labels)
					legacy := mc.addPod(t, a, "legacy", map[string]string{"app": "legacy"})
					if id := mc.checkCEP(t, legacy); id != int64(legacyID) {
						t.Fatalf("legacy has identity %d, want the existing %d", id, legacyID)
					}
					mc.checkIdentityStored(t, int64(legacyID), labels)
					mc.checkIdentityUsers(t, int64(legacyID), labels, a)
					mc.deletePod(t, legacy)
					mc.checkNoCEP(t, "legacy")
					mc.checkSlices(t, map[string]int64{"web": webID, "client": clientID})
				})
			}

			t.Run("multi-node", func(t *testing.T) {
				// Each node's datapath has the other node's pod, with its
				// identity, behind that node.
				checkIPCache(t, b, web.ip, webID, a.ip)
				checkIPCache(t, a, client.ip, clientID, b.ip)
				// A pod with web's labels on the other node shares its
				// identity: in kvstore mode both nodes hold a value key.
				web2 = mc.addPod(t, b, "web-2", map[string]string{"app": "web"})
				if id := mc.checkCEP(t, web2); id != webID {
					t.Fatalf("web-2 has identity %d, web %d: one label set, two identities", id, webID)
				}
				labels := mc.checkIdentityLabels(t, webID)
				mc.checkIdentityUsers(t, webID, labels, a, b)
				checkIPCache(t, a, web2.ip, webID, b.ip)
				mc.checkSlices(t, map[string]int64{"web": webID, "client": clientID, "web-2": webID})
			})

			t.Run("policy", func(t *testing.T) {
				open := []string{"ingress 0 any * allow", "egress 0 any * allow"}
				checkPolicyMap(t, a, web, open)
				// web admits client on TCP 80; client may reach web on
				// TCP 80 only. The remote identity reaches each node
				// from the mode's identity backend.
				cnps := []*ciliumv2.CiliumNetworkPolicy{
					cnp("web-ingress", "web", &api.IngressRule{IngressCommonRule: api.IngressCommonRule{FromEndpoints: selectApp("client")}, ToPorts: tcp80()}, nil),
					cnp("client-egress", "client", nil, &api.EgressRule{EgressCommonRule: api.EgressCommonRule{ToEndpoints: selectApp("web")}, ToPorts: tcp80()}),
				}
				for _, p := range cnps {
					if _, err := mc.admin.CiliumV2().CiliumNetworkPolicies(mc.ns).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
						t.Fatal(err)
					}
				}
				checkPolicyMap(t, a, web, []string{fmt.Sprintf("ingress %d tcp 80 allow", clientID), "egress 0 any * allow"})
				checkPolicyMap(t, b, web2, []string{fmt.Sprintf("ingress %d tcp 80 allow", clientID), "egress 0 any * allow"})
				checkPolicyMap(t, b, client, []string{"ingress 0 any * allow", fmt.Sprintf("egress %d tcp 80 allow", webID)})
				for _, p := range cnps {
					if err := mc.admin.CiliumV2().CiliumNetworkPolicies(mc.ns).Delete(t.Context(), p.Name, metav1.DeleteOptions{}); err != nil {
						t.Fatal(err)
					}
				}
				checkPolicyMap(t, a, web, open)
				checkPolicyMap(t, b, client, open)
			})

			t.Run("delete", func(t *testing.T) {
				// web goes: its CEP, its slice entry, the other node's
				// ipcache entry and (kvstore) node a's value key; the
				// identity stays, web-2 uses it.
				mc.deletePod(t, web)
				mc.checkNoCEP(t, "web")
				mc.checkSlices(t, map[string]int64{"client": clientID, "web-2": webID})
				checkIPCache(t, b, web.ip, 0, "")
				labels := mc.checkIdentityLabels(t, webID)
				mc.checkIdentityUsers(t, webID, labels, b)
				mc.checkIdentityStored(t, webID, labels)
				// The last user goes: no node uses the identity any more
				// (the operator's GC collects it, below).
				mc.deletePod(t, web2)
				mc.checkNoCEP(t, "web-2")
				mc.checkIdentityUsers(t, webID, labels)
				checkIPCache(t, a, web2.ip, 0, "")
			})

			t.Run("identity-gc", func(t *testing.T) {
				// The operator collects web's identity, which nothing
				// uses, from the mode's backend, and keeps client's.
				mc.checkIdentityCollected(t, webID)
				labels := mc.checkIdentityLabels(t, clientID)
				mc.checkIdentityStored(t, clientID, labels)
				mc.checkIdentityUsers(t, clientID, labels, b)
			})
		})
	}
}

// checkCEP waits for p's CiliumEndpoint, written by its agent, with p's
// address, node and a security identity, and returns the identity.
func (mc *modeCluster) checkCEP(t *testing.T, p *podEndpoint) int64 {
	t.Helper()
	var id int64
	eventually(t, 30*time.Second, "the CiliumEndpoint of "+p.name, func() error {
		cep, err := mc.admin.CiliumV2().CiliumEndpoints(mc.ns).Get(t.Context(), p.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		st := cep.Status
		if st.Identity == nil || st.Identity.ID == 0 || st.Networking == nil || len(st.Networking.Addressing) != 1 {
			return fmt.Errorf("incomplete: %+v", st)
		}
		if st.Networking.Addressing[0].IPV4 != p.ip || st.Networking.NodeIP != p.on.ip || st.ID != p.id {
			return fmt.Errorf("CEP says endpoint %d, %s on %s; the agent made endpoint %d, %s on %s",
				st.ID, st.Networking.Addressing[0].IPV4, st.Networking.NodeIP, p.id, p.ip, p.on.ip)
		}
		if st.State != ciliumv2.EndpointStateReady {
			return fmt.Errorf("state %q", st.State)
		}
		id = st.Identity.ID
		return nil
	})
	return id
}

// checkNoCEP waits until the CiliumEndpoint name is gone.
func (mc *modeCluster) checkNoCEP(t *testing.T, name string) {
	t.Helper()
	eventually(t, 30*time.Second, "the CiliumEndpoint of "+name+" to go", func() error {
		_, err := mc.admin.CiliumV2().CiliumEndpoints(mc.ns).Get(t.Context(), name, metav1.GetOptions{})
		if err == nil {
			return fmt.Errorf("still there")
		}
		return nil
	})
}

// checkSlices: in CES mode, the namespace's slices hold exactly want
// (endpoint name -> identity); in CEP mode the operator writes none.
func (mc *modeCluster) checkSlices(t *testing.T, want map[string]int64) {
	t.Helper()
	if !mc.slices {
		l, err := mc.admin.CiliumV2alpha1().CiliumEndpointSlices().List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, ces := range l.Items {
			if ces.Namespace == mc.ns {
				t.Fatalf("slice %s of %s without --enable-cilium-endpoint-slice", ces.Name, mc.ns)
			}
		}
		return
	}
	eventually(t, 30*time.Second, "the slices of "+mc.ns, func() error {
		l, err := mc.admin.CiliumV2alpha1().CiliumEndpointSlices().List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		got := map[string]int64{}
		for _, ces := range l.Items {
			if ces.Namespace != mc.ns {
				continue
			}
			for _, e := range ces.Endpoints {
				got[e.Name] = e.IdentityID
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("slices hold %v, want %v", got, want)
		}
		return nil
	})
}

// checkIdentityLabels waits until both agents know identity id (GET
// /v1/identity/<id>, from their CiliumIdentity table, which the mode's
// backend fills) with the same labels, among them want, and returns them
// sorted.
func (mc *modeCluster) checkIdentityLabels(t *testing.T, id int64, want ...string) []string {
	t.Helper()
	var labels []string
	for _, a := range mc.agents {
		eventually(t, 30*time.Second, fmt.Sprintf("identity %d on %s", id, a.node), func() error {
			got, err := a.api.GetIdentity(t.Context(), strconv.FormatInt(id, 10))
			if err != nil {
				return err
			}
			l := slices.Sorted(slices.Values(got.Labels))
			for _, w := range want {
				if !slices.Contains(l, w) {
					return fmt.Errorf("labels %v lack %s", l, w)
				}
			}
			if labels != nil && !slices.Equal(l, labels) {
				return fmt.Errorf("labels %v here, %v on %s", l, labels, mc.agents[0].node)
			}
			labels = l
			return nil
		})
	}
	return labels
}

// checkIdentityStored checks that identity id with labels is where the
// mode keeps identities, and only there: a CiliumIdentity object named
// id, or etcd's master key cilium/state/identities/v1/id/<id> holding the
// labels key (and then no CiliumIdentity: kvstore agents do not write
// them), or both in the double-write modes.
func (mc *modeCluster) checkIdentityStored(t *testing.T, id int64, labels []string) {
	t.Helper()
	name := strconv.FormatInt(id, 10)
	obj, err := mc.admin.CiliumV2().CiliumIdentities().Get(t.Context(), name, metav1.GetOptions{})
	switch {
	case mc.crd() && err != nil:
		t.Fatalf("CiliumIdentity %s: %v", name, err)
	case mc.crd():
		var got []string
		for k, v := range obj.SecurityLabels {
			got = append(got, k+"="+v)
		}
		if slices.Sort(got); !slices.Equal(got, labels) {
			t.Fatalf("CiliumIdentity %s has labels %v, the agents say %v", name, got, labels)
		}
	case err == nil:
		t.Fatalf("CiliumIdentity %s exists in kvstore mode: %v", name, obj.SecurityLabels)
	}
	if !mc.kvstore() {
		return
	}
	key := kvstore.IdentityIDPrefix + name
	resp, err := mc.etcd.Get(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 {
		t.Fatalf("no etcd key %s", key)
	}
	if v := resp.Kvs[0].Value; string(v) != labelsKey(labels) {
		t.Fatalf("etcd %s = %q, want %q (the agents' labels)", key, v, labelsKey(labels))
	} else if _, ok := kvstore.ParseLabelsKey(v); !ok {
		t.Fatalf("etcd %s = %q is not a canonical labels key", key, v)
	}
}

// checkIdentityCollected waits until the operator's GC has deleted
// identity id from the mode's backend (the CiliumIdentity object, or the
// etcd master key) and both agents have forgotten it.
func (mc *modeCluster) checkIdentityCollected(t *testing.T, id int64) {
	t.Helper()
	name := strconv.FormatInt(id, 10)
	eventually(t, time.Minute, "identity "+name+" collected", func() error {
		if mc.kvstore() {
			resp, err := mc.etcd.Get(t.Context(), kvstore.IdentityIDPrefix+name)
			if err != nil {
				return err
			}
			if len(resp.Kvs) != 0 {
				return fmt.Errorf("etcd still has %s = %q", resp.Kvs[0].Key, resp.Kvs[0].Value)
			}
		}
		if _, err := mc.admin.CiliumV2().CiliumIdentities().Get(t.Context(), name, metav1.GetOptions{}); mc.crd() && err == nil {
			return fmt.Errorf("CiliumIdentity %s still there", name)
		}
		for _, a := range mc.agents {
			if _, err := a.api.GetIdentity(t.Context(), name); err == nil {
				return fmt.Errorf("%s still knows it", a.node)
			}
		}
		return nil
	})
}

// createInReadBackend makes identity id of labels only in the backend
// the double-write mode reads: a CiliumIdentity object
// (doublewrite-readcrd) or an etcd master key (doublewrite-readkvstore).
func (mc *modeCluster) createInReadBackend(t *testing.T, id int, labels []string) {
	t.Helper()
	if mc.identity == identity.AllocationModeDoubleWriteReadKVStore {
		if _, err := mc.etcd.Put(t.Context(), kvstore.IdentityIDPrefix+strconv.Itoa(id), labelsKey(labels)); err != nil {
			t.Fatal(err)
		}
		return
	}
	sec := map[string]string{}
	for _, l := range labels {
		k, v, _ := strings.Cut(l, "=")
		sec[k] = v
	}
	obj := &ciliumv2.CiliumIdentity{ObjectMeta: metav1.ObjectMeta{Name: strconv.Itoa(id)}, SecurityLabels: sec}
	if _, err := mc.admin.CiliumV2().CiliumIdentities().Create(t.Context(), obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = mc.admin.CiliumV2().CiliumIdentities().Delete(context.Background(), obj.Name, metav1.DeleteOptions{})
	})
}

// checkIdentityUsers checks which nodes use identity id. Where etcd is
// written that is its value keys, one per node, holding the number;
// CiliumIdentity objects keep no trace of their users, and the check is
// that the labels map to this one object (no node allocated another).
// The double-write modes get both checks.
func (mc *modeCluster) checkIdentityUsers(t *testing.T, id int64, labels []string, users ...*modeAgent) {
	t.Helper()
	if mc.crd() {
		l, err := mc.admin.CiliumV2().CiliumIdentities().List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var same []string
		for _, obj := range l.Items {
			var got []string
			for k, v := range obj.SecurityLabels {
				got = append(got, k+"="+v)
			}
			if slices.Sort(got); slices.Equal(got, labels) {
				same = append(same, obj.Name)
			}
		}
		// Unused, the operator's GC may have collected it already.
		if (len(users) > 0 || len(same) > 0) && !slices.Equal(same, []string{strconv.FormatInt(id, 10)}) {
			t.Fatalf("CiliumIdentities with labels %v: %v, want only %d", labels, same, id)
		}
	}
	if !mc.kvstore() {
		return
	}
	var want []string
	for _, a := range users {
		want = append(want, kvstore.IdentityValueKey(labelsKey(labels), a.ip)+"="+strconv.FormatInt(id, 10))
	}
	slices.Sort(want)
	prefix := kvstore.IdentityValueKeysOf(labelsKey(labels))
	eventually(t, 30*time.Second, "the value keys "+prefix+"*", func() error {
		resp, err := mc.etcd.Get(t.Context(), prefix, clientv3.WithPrefix())
		if err != nil {
			return err
		}
		var got []string
		for _, kv := range resp.Kvs {
			got = append(got, string(kv.Key)+"="+string(kv.Value))
		}
		if !slices.Equal(got, want) {
			return fmt.Errorf("got %v, want %v", got, want)
		}
		return nil
	})
}

// checkIPCache waits until agent a's ipcache map has ip with identity id
// and tunnel endpoint node, or (id 0) does not have ip.
func checkIPCache(t *testing.T, a *modeAgent, ip string, id int64, node string) {
	t.Helper()
	what := fmt.Sprintf("%s in %s's ipcache map with identity %d behind %s", ip, a.node, id, node)
	if id == 0 {
		what = fmt.Sprintf("%s to leave %s's ipcache map", ip, a.node)
	}
	eventually(t, 30*time.Second, what, func() error {
		_, rows, err := a.maps.Dump(controlplane.IPCacheMap)
		if err != nil {
			return err
		}
		for _, r := range rows {
			if r[0] != ip+"/32" {
				continue
			}
			if id == 0 {
				return fmt.Errorf("still there: %v", r)
			}
			if r[1] != strconv.FormatInt(id, 10) || r[2] != node {
				return fmt.Errorf("entry %v", r)
			}
			return nil
		}
		if id == 0 {
			return nil
		}
		return fmt.Errorf("no entry")
	})
}

// checkPolicyMap waits until p's policy map on agent a holds exactly want
// ("direction identity proto port verdict" each).
func checkPolicyMap(t *testing.T, a *modeAgent, p *podEndpoint, want []string) {
	t.Helper()
	name := fmt.Sprintf("%s%05d", controlplane.PolicyMapPrefix, p.id)
	slices.Sort(want)
	eventually(t, 30*time.Second, name+" on "+a.node, func() error {
		_, rows, err := a.maps.Dump(name)
		if err != nil {
			return err
		}
		var got []string
		for _, r := range rows {
			got = append(got, strings.Join(r, " "))
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			return fmt.Errorf("got %q, want %q", got, want)
		}
		return nil
	})
}

func cnp(name, app string, ingress *api.IngressRule, egress *api.EgressRule) *ciliumv2.CiliumNetworkPolicy {
	r := &api.Rule{EndpointSelector: &api.EndpointSelector{MatchLabels: map[string]string{"app": app}}}
	if ingress != nil {
		r.Ingress = []api.IngressRule{*ingress}
	}
	if egress != nil {
		r.Egress = []api.EgressRule{*egress}
	}
	return &ciliumv2.CiliumNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: r}
}

// selectApp selects the endpoints labelled app.
func selectApp(app string) []api.EndpointSelector {
	return []api.EndpointSelector{{MatchLabels: map[string]string{"app": app}}}
}

// tcp80 is TCP port 80.
func tcp80() api.PortRules {
	return api.PortRules{{Ports: []api.PortProtocol{{Port: "80", Protocol: api.ProtoTCP}}}}
}
