package realnode

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cellium/cellium/api/client/clientset/versioned"
)

// Cilium's etcd keys (Documentation/operations/kvstore.md), spelled out
// here rather than taken from cells/kvstore: the test checks the layout.
const (
	kvNodesPrefix      = "cilium/state/nodes/v1/"
	kvIPPrefix         = "cilium/state/ip/v1/default/"
	kvIdentityIDPrefix = "cilium/state/identities/v1/id/"
	kvIdentityValues   = "cilium/state/identities/v1/value/"
)

// checkKVStore fails unless the cluster's etcd, which c's agents use in
// kvstore mode (ClusterOptions.KVStore), holds what they exchanged through
// it, and the agents use it:
//
//   - each node's key cilium/state/nodes/v1/default/<name> names the node
//     and its address;
//   - for the pod names[i] (in space, on node i, at ips[names[i]]) the
//     ipcache key cilium/state/ip/v1/default/<IP> has its IP, node i's
//     address as HostIP and the identity of its CiliumEndpoint;
//   - that identity's master key cilium/state/identities/v1/id/<ID> holds
//     the pod's labels, and node i's value key of those labels (suffix its
//     address) holds the number;
//   - every other node mirrors node i's key (cellium statedb kvstore-nodes)
//     and has the pod's ipcache row from the key (source kvstore);
//   - no CiliumIdentity object exists (identities are not CRDs in this
//     mode).
func checkKVStore(t *testing.T, c *Cluster, space string, names []string, ips map[string]string) {
	t.Helper()
	ctx := t.Context()
	etcd, err := clientv3.New(clientv3.Config{Endpoints: []string{c.Control.EtcdURL()}, DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("etcd client for %s: %v", c.Control.EtcdURL(), err)
	}
	defer etcd.Close()
	get := func(key string) ([]byte, error) {
		gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		resp, err := etcd.Get(gctx, key)
		if err != nil {
			return nil, fmt.Errorf("get %s: %w", key, err)
		}
		if len(resp.Kvs) == 0 {
			return nil, fmt.Errorf("no key %s", key)
		}
		return resp.Kvs[0].Value, nil
	}
	cli, _ := filepath.Glob(filepath.Join(c.Dir, "images", "bin-*", "cellium"))
	if len(cli) == 0 {
		t.Fatal("no cellium CLI in the packed image's folder")
	}
	agent := func(n *Node, args ...string) (string, error) {
		out, err := exec.Command(cli[0], append([]string{"--host", "unix://" + n.AgentConfig().SocketPath()}, args...)...).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("cellium %s on node %s: %v: %s", strings.Join(args, " "), n.Name, err, out)
		}
		return string(out), nil
	}

	// The nodes' keys (Cilium's Node JSON: Go field names).
	for _, n := range c.Nodes {
		key := kvNodesPrefix + "default/" + n.Name
		eventually(t, time.Minute, "etcd key "+key, func() error {
			v, err := get(key)
			if err != nil {
				return err
			}
			var node struct {
				Name, Cluster string
				IPAddresses   []struct{ Type, IP string }
			}
			if err := json.Unmarshal(v, &node); err != nil {
				return fmt.Errorf("%s: %w: %s", key, err, v)
			}
			if node.Name != n.Name || node.Cluster != "default" ||
				!slices.ContainsFunc(node.IPAddresses, func(a struct{ Type, IP string }) bool { return a.IP == n.IP.String() }) {
				return fmt.Errorf("%s is %s; want node %s of cluster default with address %s", key, v, n.Name, n.IP)
			}
			return nil
		})
	}
	resp, err := etcd.Get(ctx, kvNodesPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("etcd: %d node keys under %s", len(resp.Kvs), kvNodesPrefix)

	cilium := versioned.NewForConfigOrDie(c.Control.RESTConfig())
	for i, name := range names {
		node := c.Nodes[i]
		cep, err := cilium.CiliumV2().CiliumEndpoints(space).Get(ctx, name, metav1.GetOptions{})
		if err != nil || cep.Status.Identity == nil {
			t.Fatalf("the CiliumEndpoint of %s/%s with an identity: %v", space, name, err)
		}
		id := cep.Status.Identity.ID
		// The pod's ipcache key (Cilium's IPIdentityPair JSON).
		ipKey := kvIPPrefix + ips[name]
		eventually(t, time.Minute, "etcd key "+ipKey+" of pod "+name, func() error {
			v, err := get(ipKey)
			if err != nil {
				return err
			}
			var pair struct {
				IP, HostIP string
				ID         int64
			}
			if err := json.Unmarshal(v, &pair); err != nil {
				return fmt.Errorf("%s: %w: %s", ipKey, err, v)
			}
			if pair.IP != ips[name] || pair.HostIP != node.IP.String() || pair.ID != id {
				return fmt.Errorf("%s is %s; want IP %s, HostIP %s (node %s), ID %d", ipKey, v, ips[name], node.IP, node.Name, id)
			}
			t.Logf("etcd: %s = %s", ipKey, v)
			return nil
		})
		// The identity's master key and node i's value key.
		idKey := kvIdentityIDPrefix + strconv.FormatInt(id, 10)
		var labels string
		eventually(t, 30*time.Second, "etcd key "+idKey+" of pod "+name, func() error {
			v, err := get(idKey)
			if err != nil {
				return err
			}
			labels = string(v)
			for _, l := range []string{"k8s:app=" + name + ";", "k8s:io.kubernetes.pod.namespace=" + space + ";"} {
				if !strings.HasPrefix(labels, l) && !strings.Contains(labels, ";"+l) {
					return fmt.Errorf("%s is %q: no label %s", idKey, labels, l)
				}
			}
			return nil
		})
		valueKey := kvIdentityValues + labels + "/" + node.IP.String()
		eventually(t, 30*time.Second, "etcd key "+valueKey, func() error {
			v, err := get(valueKey)
			if err != nil {
				return err
			}
			if string(v) != strconv.FormatInt(id, 10) {
				return fmt.Errorf("%s is %q, want %d", valueKey, v, id)
			}
			return nil
		})
		t.Logf("etcd: %s = %s; %s", idKey, labels, valueKey)

		// The other nodes know node i and its pod from etcd.
		for j, viewer := range c.Nodes {
			if j == i {
				continue
			}
			eventually(t, time.Minute, "node "+viewer.Name+" mirroring node "+node.Name+"'s key", func() error {
				out, err := agent(viewer, "statedb", "kvstore-nodes", "-o", "jsonpath={[*].name}")
				if err != nil {
					return err
				}
				if !slices.Contains(strings.Fields(out), node.Name) {
					return fmt.Errorf("kvstore-nodes has %q", out)
				}
				return nil
			})
			eventually(t, time.Minute, "node "+viewer.Name+"'s ipcache row of "+name+" from etcd", func() error {
				out, err := agent(viewer, "ipcache", "list")
				if err != nil {
					return err
				}
				for _, line := range strings.Split(out, "\n") {
					// PREFIX IDENTITY SOURCE OWNER TUNNEL-ENDPOINT STATUS
					if f := strings.Fields(line); len(f) >= 3 && f[0] == ips[name]+"/32" {
						if f[1] != strconv.FormatInt(id, 10) || f[2] != "kvstore" {
							return fmt.Errorf("row %q; want identity %d from source kvstore", line, id)
						}
						return nil
					}
				}
				return fmt.Errorf("no row for %s/32 in:\n%s", ips[name], out)
			})
		}
	}

	// Identities are etcd keys only.
	list, err := cilium.CiliumV2().CiliumIdentities().List(ctx, metav1.ListOptions{})
	switch {
	case apierrors.IsNotFound(err):
		t.Log("no CiliumIdentity resource at all")
	case err != nil:
		t.Fatal(err)
	case len(list.Items) > 0:
		var ids []string
		for _, ci := range list.Items {
			ids = append(ids, ci.Name)
		}
		t.Errorf("CiliumIdentity objects %v exist in kvstore mode", ids)
	}
}

// dumpKVStore logs, for a failed test in kvstore mode, every key under
// cilium/ in the cluster's etcd with the start of its value.
func dumpKVStore(t *testing.T, c *Cluster) {
	t.Helper()
	etcd, err := clientv3.New(clientv3.Config{Endpoints: []string{c.Control.EtcdURL()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Logf("--- etcd: %v", err)
		return
	}
	defer etcd.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := etcd.Get(ctx, "cilium/", clientv3.WithPrefix())
	if err != nil {
		t.Logf("--- etcd: %v", err)
		return
	}
	var b strings.Builder
	for _, kv := range resp.Kvs {
		v := string(kv.Value)
		if len(v) > 200 {
			v = v[:200] + "..."
		}
		fmt.Fprintf(&b, "%s (lease %x) = %s\n", kv.Key, kv.Lease, v)
	}
	t.Logf("--- etcd: %d keys under cilium/ ---\n%s", len(resp.Kvs), b.String())
}
