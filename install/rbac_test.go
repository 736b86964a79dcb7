package install_test

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextclientset "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/client/clientset/versioned"
	"github.com/cellium/cellium/api/crds"
	"github.com/cellium/cellium/cells/crdregister"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/test/harness"
)

// TestOnlyTheAgentWritesCiliumEndpoints applies the chart's RBAC to a real
// API server and tries to write a CiliumEndpoint as others than the agent:
// a pod's ServiceAccount with the default RBAC, ServiceAccounts bound to
// the built-in "edit" and "admin" roles in their own namespace (the
// namespace's own administrators: the chart must not aggregate CEP rights
// into them), and the operator's ServiceAccount. None may create, update
// or patch one (a CEP names the identity of the addresses it lists: see
// Documentation/concepts/ipcache-trust.md). The agent's ServiceAccount may
// create and patch one, which is what cells/cepsync does; it is not
// granted update, which it does not use.
func TestOnlyTheAgentWritesCiliumEndpoints(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver; skipped with -short")
	}
	c := harness.ForTest(t, harness.Options{})
	ctx := t.Context()
	all, err := crds.All()
	if err != nil {
		t.Fatal(err)
	}
	apiext := apiextclientset.NewForConfigOrDie(c.RESTConfig())
	if err := crdregister.Register(ctx, apiext.ApiextensionsV1().CustomResourceDefinitions(), all, hivetest.Logger(t)); err != nil {
		t.Fatal(err)
	}
	if err := c.InstallRBAC(ctx); err != nil {
		t.Fatal(err)
	}

	const ns = "tenant"
	cs := c.Clientset()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, sa := range []string{"app", "editor", "admin"} {
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for sa, role := range map[string]string{"editor": "edit", "admin": "admin"} {
		rb := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: sa, Namespace: ns},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}},
		}
		if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// A CEP the attackers try to change, written by the cluster admin.
	admin := ciliumClient(t, c.Kubeconfig())
	victim := testCEP(ns, "victim", 2000)
	if _, err := admin.CiliumV2().CiliumEndpoints(ns).Create(ctx, victim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	patch := []byte(`{"status":{"identity":{"id":1}}}`)

	attackers := map[string]func(context.Context) (string, error){
		"pod ServiceAccount " + ns + "/app": func(ctx context.Context) (string, error) {
			return c.ServiceAccountKubeconfig(ctx, ns, "app")
		},
		"ServiceAccount " + ns + "/editor (edit in " + ns + ")": func(ctx context.Context) (string, error) {
			return c.ServiceAccountKubeconfig(ctx, ns, "editor")
		},
		"ServiceAccount " + ns + "/admin (admin in " + ns + ")": func(ctx context.Context) (string, error) {
			return c.ServiceAccountKubeconfig(ctx, ns, "admin")
		},
		"the operator": c.OperatorKubeconfig,
	}
	for who, kubeconfig := range attackers {
		t.Run(who, func(t *testing.T) {
			kc, err := kubeconfig(ctx)
			if err != nil {
				t.Fatal(err)
			}
			cl := ciliumClient(t, kc).CiliumV2().CiliumEndpoints(ns)
			_, err = cl.Create(ctx, testCEP(ns, "evil", 1), metav1.CreateOptions{})
			wantForbidden(t, "create", err)
			cur, err := admin.CiliumV2().CiliumEndpoints(ns).Get(ctx, victim.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			cur.Status.Identity.ID = 1
			_, err = cl.Update(ctx, cur, metav1.UpdateOptions{})
			wantForbidden(t, "update", err)
			_, err = cl.Patch(ctx, victim.Name, types.MergePatchType, patch, metav1.PatchOptions{})
			wantForbidden(t, "patch", err)
		})
	}

	t.Run("the agent", func(t *testing.T) {
		kc, err := c.AgentKubeconfig(ctx)
		if err != nil {
			t.Fatal(err)
		}
		cl := ciliumClient(t, kc).CiliumV2().CiliumEndpoints(ns)
		if _, err := cl.Create(ctx, testCEP(ns, "pod", 2000), metav1.CreateOptions{}); err != nil {
			t.Fatalf("create: %v", err)
		}
		jsonPatch := []byte(`[{"op":"replace","path":"/status/identity/id","value":2001}]`)
		got, err := cl.Patch(ctx, "pod", types.JSONPatchType, jsonPatch, metav1.PatchOptions{})
		if err != nil {
			t.Fatalf("patch: %v", err)
		}
		if got.Status.Identity.ID != 2001 {
			t.Fatalf("patched identity %d, want 2001", got.Status.Identity.ID)
		}
		_, err = cl.Update(ctx, got, metav1.UpdateOptions{})
		wantForbidden(t, "update (not granted: the agent patches)", err)
	})
}

func testCEP(ns, name string, id int64) *ciliumv2.CiliumEndpoint {
	return &ciliumv2.CiliumEndpoint{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Status: ciliumv2.EndpointStatus{
			Identity: &ciliumv2.EndpointIdentity{ID: id},
			Networking: &ciliumv2.EndpointNetworking{NodeIP: "192.168.0.2",
				Addressing: ciliumv2.AddressPairList{{IPV4: "10.2.0.9"}}},
		},
	}
}

func ciliumClient(t *testing.T, kubeconfig string) versioned.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := versioned.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func wantForbidden(t *testing.T, what string, err error) {
	t.Helper()
	if !apierrors.IsForbidden(err) {
		t.Errorf("%s: %v, want Forbidden", what, errOrNil(err))
	}
}

func errOrNil(err error) string {
	if err == nil {
		return "allowed"
	}
	return fmt.Sprintf("error %v", err)
}
