package k8s

import (
	"context"
	"fmt"
	"os"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/tables"
)

// NodeName is the name of the node this agent runs on.
type NodeName string

// NodeNameFromEnv reads the node name from K8S_NODE_NAME, as Cilium does,
// falling back to the host name.
func NodeNameFromEnv() (NodeName, error) {
	if n := os.Getenv("K8S_NODE_NAME"); n != "" {
		return NodeName(n), nil
	}
	h, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("node name: K8S_NODE_NAME is not set and the host name is unknown: %w", err)
	}
	return NodeName(h), nil
}

// listWatch makes the ListerWatcher of a resource.
type listWatch func(cs Clientset) cache.ListerWatcher

// resource is a module that owns one table and mirrors one resource
// into it. The writable table stays inside the module; everyone gets the
// read-only statedb.Table[T].
func resource[T k8stables.Object](id, title string, newTable func(*statedb.DB) (statedb.RWTable[T], error), newLW any) hive.Cell {
	return slimResource[T](id, title, newTable, newLW, nil)
}

// slimResource is resource whose table keeps what slim (nil: all but the
// managed fields) returns of each object, for the resources with a row
// per pod or identity of the cluster.
func slimResource[T k8stables.Object](id, title string, newTable func(*statedb.DB) (statedb.RWTable[T], error), newLW any, slim func() func(T) T) hive.Cell {
	return hive.Module(id, title,
		// The table is written only by this module's reflector.
		hive.ProvidePrivate(newTable),
		// Everyone else reads it.
		hive.Provide(statedb.RWTable[T].ToTable),
		// The ListerWatcher; may depend on the node name.
		hive.ProvidePrivate(newLW),
		// The reflector job; it marks the table initialized after the first list.
		hive.Invoke(func(db *statedb.DB, table statedb.RWTable[T], cs Clientset, lw listWatch, jobs hive.Jobs) error {
			txn := db.WriteTxn(table)
			done := table.RegisterInitializer(txn, "k8s-reflector")
			txn.Commit()
			store := &tableStore[T]{db: db, table: table, init: tables.NewInitGate(done)}
			if slim != nil {
				store.slim = slim()
			}
			var zero T
			addReflectorJob(jobs, table.Name(), cs, lw, zero, store)
			return nil
		}),
	)
}

// addReflectorJob adds the job that runs a reflector of lw's objects (of
// example's type) into store, once the clientset is configured.
func addReflectorJob(jobs hive.Jobs, name string, cs Clientset, lw listWatch, example any, store cache.ReflectorStore) {
	jobs.Add(hive.Service("reflect-"+name,
		func() error {
			if !cs.IsEnabled() {
				return fmt.Errorf("mirror %s: %w", name, ErrNotConfigured)
			}
			return nil
		},
		func(ctx context.Context, h hive.Health) {
			r := cache.NewReflectorWithOptions(withoutWatchList(lw(cs)), example, store, cache.ReflectorOptions{Name: name})
			h.OK("watching")
			r.RunWithContext(ctx)
		}))
}

// ciliumEndpointsLW lists and watches every CiliumEndpoint.
func ciliumEndpointsLW(cs Clientset) cache.ListerWatcher {
	c := cs.Cilium().CiliumV2().CiliumEndpoints("")
	return typedLW(c.List, c.Watch, fields.Everything())
}

// withoutWatchList makes the reflector list, then watch, instead of
// streaming the initial list in a watch ("watch-list"): client-go's
// watch-list path backs off without looking at the context, so with the
// API server down a reflector took up to 30 s to stop, and the agent's
// stop timed out. The list path stops at once.
func withoutWatchList(lw cache.ListerWatcher) cache.ListerWatcher {
	if l, ok := lw.(*cache.ListWatch); ok {
		return listWatchNoStream{l}
	}
	return lw
}

// listWatchNoStream tells the reflector that watch-list is not supported.
type listWatchNoStream struct{ *cache.ListWatch }

// IsWatchListSemanticsUnSupported is how client-go asks.
func (listWatchNoStream) IsWatchListSemanticsUnSupported() bool { return true }

// tableStore is the reflector's store: it writes into the table.
type tableStore[T k8stables.Object] struct {
	db    *statedb.DB
	table statedb.RWTable[T]
	init  tables.InitGate
	// slim (nil: none) returns what the table keeps of an object, a
	// copy; without it only the managed fields are dropped.
	slim func(T) T
}

// keep returns what the table keeps of o.
func (s *tableStore[T]) keep(o T) T {
	if s.slim != nil {
		return s.slim(o)
	}
	// Written only when there is something to drop: a fake clientset's
	// watch hands out the very object its tracker keeps (and reads for
	// every Get), so an unconditional write races with it.
	if len(o.GetManagedFields()) > 0 {
		o.SetManagedFields(nil)
	}
	return o
}

func (s *tableStore[T]) Add(obj any) error    { return s.upsert(obj) }
func (s *tableStore[T]) Update(obj any) error { return s.upsert(obj) }
func (s *tableStore[T]) Resync() error        { return nil }

func (s *tableStore[T]) upsert(obj any) error {
	o, ok := obj.(T)
	if !ok {
		return fmt.Errorf("table %s: unexpected object %T", s.table.Name(), obj)
	}
	o = s.keep(o)
	txn := s.db.WriteTxn(s.table)
	defer txn.Abort()
	if _, _, err := s.table.Insert(txn, o); err != nil {
		return err
	}
	txn.Commit()
	return nil
}

func (s *tableStore[T]) Delete(obj any) error {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	o, ok := obj.(T)
	if !ok {
		return fmt.Errorf("table %s: unexpected object %T", s.table.Name(), obj)
	}
	txn := s.db.WriteTxn(s.table)
	defer txn.Abort()
	if _, _, err := s.table.Delete(txn, o); err != nil {
		return err
	}
	txn.Commit()
	return nil
}

// Replace makes the table exactly the listed objects and, the first time,
// marks it initialized.
func (s *tableStore[T]) Replace(list []any, _ string) error {
	txn := s.db.WriteTxn(s.table)
	defer txn.Abort()
	keep := make(map[string]bool, len(list))
	for _, item := range list {
		o, ok := item.(T)
		if !ok {
			return fmt.Errorf("table %s: unexpected object %T", s.table.Name(), item)
		}
		o = s.keep(o)
		keep[k8stables.Key(o)] = true
		if _, _, err := s.table.Insert(txn, o); err != nil {
			return err
		}
	}
	for obj := range s.table.All(txn) {
		if !keep[k8stables.Key(obj)] {
			if _, _, err := s.table.Delete(txn, obj); err != nil {
				return err
			}
		}
	}
	s.init.Open(txn)
	txn.Commit()
	return nil
}

func everything(lw func(namespace string, sel fields.Selector) cache.ListerWatcher) listWatch {
	return func(Clientset) cache.ListerWatcher { return lw("", fields.Everything()) }
}

// Resource cells. Each provides statedb.Table[T] of its resource.
var (
	// LocalPodsCell mirrors the pods scheduled to this node (K8S_NODE_NAME).
	LocalPodsCell = resource("pods", "Pods of this node", k8stables.NewPodsTable,
		func(node NodeName) listWatch {
			return func(cs Clientset) cache.ListerWatcher {
				pods := cs.CoreV1().Pods("")
				return typedLW(pods.List, pods.Watch, fields.OneTermEqualSelector("spec.nodeName", string(node)))
			}
		})
	// AllPodsCell mirrors every pod of the cluster (operator).
	AllPodsCell = resource("pods", "Pods of all nodes", k8stables.NewPodsTable,
		func() listWatch {
			return func(cs Clientset) cache.ListerWatcher {
				pods := cs.CoreV1().Pods("")
				return typedLW(pods.List, pods.Watch, fields.Everything())
			}
		})
	// NamespacesCell mirrors namespaces.
	NamespacesCell = resource("namespaces", "Namespaces", k8stables.NewNamespacesTable,
		func() listWatch {
			return func(cs Clientset) cache.ListerWatcher {
				c := cs.CoreV1().Namespaces()
				return typedLW(c.List, c.Watch, fields.Everything())
			}
		})
	// NodesCell mirrors nodes.
	NodesCell = resource("nodes", "Nodes", k8stables.NewNodesTable,
		func() listWatch {
			return func(cs Clientset) cache.ListerWatcher {
				c := cs.CoreV1().Nodes()
				return typedLW(c.List, c.Watch, fields.Everything())
			}
		})
	// NetworkPoliciesCell mirrors Kubernetes NetworkPolicies.
	NetworkPoliciesCell = resource("network-policies", "Kubernetes NetworkPolicies", k8stables.NewNetworkPoliciesTable,
		func() listWatch {
			return func(cs Clientset) cache.ListerWatcher {
				c := cs.NetworkingV1().NetworkPolicies("")
				return typedLW(c.List, c.Watch, fields.Everything())
			}
		})
	// CNPsCell mirrors CiliumNetworkPolicies.
	CNPsCell = resource("cnps", "CiliumNetworkPolicies", k8stables.NewCNPsTable,
		func() listWatch {
			return func(cs Clientset) cache.ListerWatcher {
				c := cs.Cilium().CiliumV2().CiliumNetworkPolicies("")
				return typedLW(c.List, c.Watch, fields.Everything())
			}
		})
	// CCNPsCell mirrors CiliumClusterwideNetworkPolicies.
	CCNPsCell = resource("ccnps", "CiliumClusterwideNetworkPolicies", k8stables.NewCCNPsTable,
		func() listWatch {
			return func(cs Clientset) cache.ListerWatcher {
				c := cs.Cilium().CiliumV2().CiliumClusterwideNetworkPolicies()
				return typedLW(c.List, c.Watch, fields.Everything())
			}
		})
	// CiliumEndpointsCell mirrors CiliumEndpoints.
	CiliumEndpointsCell = resource("cilium-endpoints", "CiliumEndpoints", k8stables.NewCiliumEndpointsTable,
		func() listWatch { return ciliumEndpointsLW })
	// CiliumNodesCell mirrors CiliumNodes.
	CiliumNodesCell = resource("cilium-nodes", "CiliumNodes", k8stables.NewCiliumNodesTable,
		func() listWatch {
			return func(cs Clientset) cache.ListerWatcher {
				c := cs.Cilium().CiliumV2().CiliumNodes()
				return typedLW(c.List, c.Watch, fields.Everything())
			}
		})
	// ServicesCell mirrors Services (the socket load balancer's
	// frontends).
	ServicesCell = resource("services", "Services", k8stables.NewServicesTable,
		func() listWatch {
			return func(cs Clientset) cache.ListerWatcher {
				c := cs.CoreV1().Services("")
				return typedLW(c.List, c.Watch, fields.Everything())
			}
		})
	// EndpointSlicesCell mirrors discovery.k8s.io/v1 EndpointSlices (the
	// socket load balancer's backends).
	EndpointSlicesCell = resource("endpoint-slices", "EndpointSlices", k8stables.NewEndpointSlicesTable,
		func() listWatch {
			return func(cs Clientset) cache.ListerWatcher {
				c := cs.DiscoveryV1().EndpointSlices("")
				return typedLW(c.List, c.Watch, fields.Everything())
			}
		})
	// CiliumLoadBalancerIPPoolsCell mirrors CiliumLoadBalancerIPPools
	// (the operator's LB IPAM).
	CiliumLoadBalancerIPPoolsCell = resource("cilium-lb-ip-pools", "CiliumLoadBalancerIPPools", k8stables.NewCiliumLoadBalancerIPPoolsTable,
		func() listWatch {
			return func(cs Clientset) cache.ListerWatcher {
				c := cs.Cilium().CiliumV2().CiliumLoadBalancerIPPools()
				return typedLW(c.List, c.Watch, fields.Everything())
			}
		})
)

// typedLW lists and watches through a typed client's List and Watch
// (which the fake clientsets of tests implement too), with the field
// selector sel.
func typedLW[L runtime.Object](list func(context.Context, metav1.ListOptions) (L, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error), sel fields.Selector,
) cache.ListerWatcher {
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel.String()
			return list(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel.String()
			return watchFn(ctx, o)
		},
	}
}

// Compile-time checks that the resource types fit the tables.
var (
	_ k8stables.Object = (*corev1.Pod)(nil)
	_ k8stables.Object = (*networkingv1.NetworkPolicy)(nil)
	_ k8stables.Object = (*ciliumv2.CiliumEndpoint)(nil)
)
