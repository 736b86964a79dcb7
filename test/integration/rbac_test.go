package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cellium/cellium/install"
	"github.com/cellium/cellium/test/harness"
)

// chartClusterRole returns the ClusterRole name of the committed manifests.
func chartClusterRole(t *testing.T, name string) *rbacv1.ClusterRole {
	t.Helper()
	root, err := harness.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := install.ReadObjects(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() == "ClusterRole" && o.GetName() == name {
			var r rbacv1.ClusterRole
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &r); err != nil {
				t.Fatal(err)
			}
			return &r
		}
	}
	t.Fatalf("no ClusterRole %s in %s", name, install.ManifestsFile)
	return nil
}

// withoutVerb returns a copy of role's rules with verb removed from the rules
// of resource in group; it fails the test if no rule granted it.
func withoutVerb(t *testing.T, rules []rbacv1.PolicyRule, group, resource, verb string) []rbacv1.PolicyRule {
	t.Helper()
	var out []rbacv1.PolicyRule
	found := false
	for _, r := range rules {
		r = *r.DeepCopy()
		if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) {
			found = true
			// Split the rule: the other resources keep the verb.
			if others := slices.DeleteFunc(slices.Clone(r.Resources), func(s string) bool { return s == resource }); len(others) > 0 {
				keep := *r.DeepCopy()
				keep.Resources = others
				out = append(out, keep)
			}
			r.Resources = []string{resource}
			r.Verbs = slices.DeleteFunc(r.Verbs, func(v string) bool { return v == verb })
		}
		if len(r.Verbs) > 0 {
			out = append(out, r)
		}
	}
	if !found {
		t.Fatalf("no rule grants %s on %s.%s", verb, resource, group)
	}
	return out
}

// TestAgentWithoutAVerbFails shows that the tests really depend on the
// chart's roles: an agent whose ServiceAccount has the chart's ClusterRole
// less one verb (watch pods) is refused by the API server and says so in its
// log, while the same agent with the chart's role mirrors pods
// (TestOperatorAndAgent). (Without list instead, a 1.37 API server still
// serves the reflector through a streaming watch-list; list stays in the
// chart for servers without it and for client-go's fallback.)
func TestAgentWithoutAVerbFails(t *testing.T) {
	c := cluster.Get(t)
	ctx := t.Context()
	if err := c.InstallRBAC(ctx); err != nil {
		t.Fatal(err)
	}
	cs := c.Clientset()
	const name = "cellium-agent-no-pod-watch"
	role := chartClusterRole(t, install.AgentServiceAccount)
	lacking := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules:      withoutVerb(t, role.Rules, "", "pods", "watch"),
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: install.Namespace}}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: install.Namespace}},
	}
	if _, err := cs.CoreV1().ServiceAccounts(install.Namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, lacking, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// t.Context() is already cancelled when cleanups run.
		ctx := context.Background()
		_ = cs.RbacV1().ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{})
		_ = cs.RbacV1().ClusterRoles().Delete(ctx, name, metav1.DeleteOptions{})
		_ = cs.CoreV1().ServiceAccounts(install.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
	})
	kubeconfig, err := c.ServiceAccountKubeconfig(ctx, install.Namespace, name)
	if err != nil {
		t.Fatal(err)
	}

	socket := filepath.Join(t.TempDir(), "cellium.sock")
	agent := startDaemon(t, "cellium-agent", []string{"K8S_NODE_NAME=node-lacking"}, "--k8s-kubeconfig-path="+kubeconfig,
		"--socket-path="+socket, "--prometheus-serve-addr=", "--state-dir="+t.TempDir(), "--write-cni-conf-when-ready=",
		"--enable-endpoint-routes=false", "--enable-bpf-datapath=false", "--enable-endpoint-health-checking=false") // never program this machine's own namespace
	refusal := fmt.Sprintf(`User "system:serviceaccount:%s:%s" cannot watch resource "pods"`, install.Namespace, name)
	eventually(t, 60*time.Second, "the API server's refusal in the agent's log", func() error {
		b, err := os.ReadFile(agent.log)
		if err != nil {
			return err
		}
		// klog quotes the error: its quotes are escaped in the log.
		if !strings.Contains(strings.ReplaceAll(string(b), `\"`, `"`), refusal) {
			return fmt.Errorf("log has no %q yet", refusal)
		}
		return nil
	})
}

// TestServiceAccountsLeastPrivilege asks the API server, as each
// ServiceAccount of the chart (SelfSubjectAccessReview with its token),
// about a few requests its binary makes and about requests it must not be
// able to make: neither is cluster-admin, neither reads Secrets, the agent
// writes no status subresource and no CRD, the operator creates no
// CiliumEndpoint or CiliumIdentity, touches no other CRD and no other Lease.
func TestServiceAccountsLeastPrivilege(t *testing.T) {
	c := cluster.Get(t)
	ctx := t.Context()
	type check struct {
		verb, group, resource, subresource, namespace, name string
		allowed                                             bool
	}
	cases := map[string][]check{
		install.AgentServiceAccount: {
			{verb: "list", resource: "pods", allowed: true},
			{verb: "watch", resource: "services", allowed: true},
			{verb: "list", group: "discovery.k8s.io", resource: "endpointslices", allowed: true},
			{verb: "update", resource: "services", namespace: "default"},
			{verb: "create", group: "discovery.k8s.io", resource: "endpointslices", namespace: "default"},
			{verb: "create", group: "cilium.io", resource: "ciliumendpoints", namespace: "default", allowed: true},
			{verb: "update", group: "cilium.io", resource: "ciliumnodes", allowed: true},
			{verb: "get", resource: "secrets", namespace: install.Namespace},
			{verb: "list", resource: "secrets"},
			{verb: "delete", resource: "pods", namespace: "default"},
			{verb: "update", resource: "nodes"},
			{verb: "delete", group: "cilium.io", resource: "ciliumnodes"},
			{verb: "update", group: "cilium.io", resource: "ciliumnodes", subresource: "status"},
			{verb: "update", group: "cilium.io", resource: "ciliumnetworkpolicies", subresource: "status", namespace: "default"},
			{verb: "create", group: "apiextensions.k8s.io", resource: "customresourcedefinitions"},
			{verb: "get", group: "coordination.k8s.io", resource: "leases", namespace: install.Namespace, name: "cellium-operator-resource-lock"},
			{verb: "impersonate", resource: "serviceaccounts"},
		},
		install.OperatorServiceAccount: {
			{verb: "create", group: "apiextensions.k8s.io", resource: "customresourcedefinitions", allowed: true},
			{verb: "update", group: "apiextensions.k8s.io", resource: "customresourcedefinitions", name: "ciliumnodes.cilium.io", allowed: true},
			{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: install.Namespace, name: "cellium-operator-resource-lock", allowed: true},
			{verb: "update", group: "cilium.io", resource: "ciliumnodes", subresource: "status", allowed: true},
			{verb: "delete", group: "cilium.io", resource: "ciliumidentities", allowed: true},
			{verb: "update", group: "cilium.io", resource: "ciliumnetworkpolicies", subresource: "status", namespace: "default", allowed: true},
			{verb: "update", group: "cilium.io", resource: "ciliumclusterwidenetworkpolicies", subresource: "status", allowed: true},
			{verb: "update", group: "cilium.io", resource: "ciliumnetworkpolicies", namespace: "default"},
			{verb: "update", group: "apiextensions.k8s.io", resource: "customresourcedefinitions", name: "widgets.example.com"},
			{verb: "delete", group: "apiextensions.k8s.io", resource: "customresourcedefinitions", name: "ciliumnodes.cilium.io"},
			{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: install.Namespace, name: "kube-controller-manager"},
			{verb: "create", group: "coordination.k8s.io", resource: "leases", namespace: "default"},
			{verb: "get", resource: "secrets", namespace: install.Namespace},
			{verb: "create", group: "cilium.io", resource: "ciliumendpoints", namespace: "default"},
			{verb: "create", group: "cilium.io", resource: "ciliumidentities"},
			{verb: "delete", resource: "pods", namespace: "default"},
			// LB IPAM writes Services' and pools' status only.
			{verb: "update", resource: "services", subresource: "status", namespace: "default", allowed: true},
			{verb: "update", group: "cilium.io", resource: "ciliumloadbalancerippools", subresource: "status", allowed: true},
			{verb: "update", resource: "services", namespace: "default"},
			{verb: "update", group: "cilium.io", resource: "ciliumloadbalancerippools"},
		},
	}
	for sa, checks := range cases {
		t.Run(sa, func(t *testing.T) {
			var kubeconfig string
			var err error
			if sa == install.AgentServiceAccount {
				kubeconfig, err = c.AgentKubeconfig(ctx)
			} else {
				kubeconfig, err = c.OperatorKubeconfig(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
			if err != nil {
				t.Fatal(err)
			}
			saClient, err := kubernetes.NewForConfig(rc)
			if err != nil {
				t.Fatal(err)
			}
			for _, ch := range checks {
				review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
					ResourceAttributes: &authorizationv1.ResourceAttributes{
						Verb: ch.verb, Group: ch.group, Resource: ch.resource, Subresource: ch.subresource,
						Namespace: ch.namespace, Name: ch.name,
					},
				}}
				got, err := saClient.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if got.Status.Allowed != ch.allowed {
					t.Errorf("%s may %s %s (group %q, subresource %q, namespace %q, name %q): %v, want %v (%s)",
						sa, ch.verb, ch.resource, ch.group, ch.subresource, ch.namespace, ch.name,
						got.Status.Allowed, ch.allowed, got.Status.Reason)
				}
			}
		})
	}
}
