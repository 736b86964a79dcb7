package harness

import (
	"context"
	"fmt"
	"path/filepath"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/cellium/cellium/install"
)

// fieldManager names the harness in server-side apply.
const fieldManager = "cellium-harness"

// kindResource returns the resource of a kind of the manifests, and whether
// it is RBAC (a ServiceAccount or a role or binding: applied for real) or a
// workload (applied as a dry run). ok is false for any other kind.
func kindResource(kind string) (gvr schema.GroupVersionResource, rbac, ok bool) {
	const rbacGroup = "rbac.authorization.k8s.io"
	switch kind {
	case "ServiceAccount":
		return schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}, true, true
	case "ClusterRole":
		return schema.GroupVersionResource{Group: rbacGroup, Version: "v1", Resource: "clusterroles"}, true, true
	case "ClusterRoleBinding":
		return schema.GroupVersionResource{Group: rbacGroup, Version: "v1", Resource: "clusterrolebindings"}, true, true
	case "Role":
		return schema.GroupVersionResource{Group: rbacGroup, Version: "v1", Resource: "roles"}, true, true
	case "RoleBinding":
		return schema.GroupVersionResource{Group: rbacGroup, Version: "v1", Resource: "rolebindings"}, true, true
	case "DaemonSet":
		return schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "daemonsets"}, false, true
	case "Deployment":
		return schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, false, true
	case "ConfigMap":
		return schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, false, true
	case "Service":
		return schema.GroupVersionResource{Version: "v1", Resource: "services"}, false, true
	case "Secret":
		// The Hubble certificates the chart issues (hubble.tls.auto).
		return schema.GroupVersionResource{Version: "v1", Resource: "secrets"}, false, true
	}
	return schema.GroupVersionResource{}, false, false
}

// InstallRBAC applies the ServiceAccounts and the RBAC objects of the
// committed plain manifests (install/kubernetes/cellium.yaml, rendered from
// the Helm chart) to the cluster, with server-side apply; it is idempotent.
// The agent and the operator of the tests run with these ServiceAccounts'
// credentials (see [Cluster.AgentKubeconfig]), so a permission missing from
// the chart fails the tests.
//
// Errors: the manifests cannot be read; the API server refuses an object.
func (c *Cluster) InstallRBAC(ctx context.Context) error {
	c.rbacMu.Lock()
	defer c.rbacMu.Unlock()
	if c.rbacDone {
		return nil
	}
	if err := c.ApplyManifests(ctx, false); err != nil {
		return err
	}
	c.rbacDone = true
	return nil
}

// ApplyManifests applies the committed plain manifests to the cluster with
// server-side apply: the ServiceAccounts and RBAC objects for real, and, if
// workloads is set, the DaemonSet and Deployment as a dry run (the cluster
// has no kubelets to run them; the API server still validates them and runs
// its admission). Any other kind fails: the harness would not know what
// applying it means.
//
// Errors: the manifests cannot be read; an object has an unknown kind; the
// API server refuses an object.
func (c *Cluster) ApplyManifests(ctx context.Context, workloads bool) error {
	root, err := RepoRoot(".")
	if err != nil {
		return fmt.Errorf("apply manifests: %w", err)
	}
	objs, err := install.ReadObjects(root)
	if err != nil {
		return fmt.Errorf("apply manifests: %w", err)
	}
	return c.applyObjects(ctx, objs, false, workloads)
}

// ApplyObjects applies objects of the kinds of the manifests (the
// ServiceAccounts, roles and bindings, the DaemonSet and the Deployment)
// for real with server-side apply, workloads included: for a cluster with
// a node that runs them (test/realnode's Install, with the chart rendered
// for that node).
//
// Errors: an object has an unknown kind; the API server refuses one.
func (c *Cluster) ApplyObjects(ctx context.Context, objs []*unstructured.Unstructured) error {
	return c.applyObjects(ctx, objs, true, true)
}

// applyObjects applies the RBAC objects for real, and the workloads if
// workloads is set: for real if real is set, else as a dry run.
func (c *Cluster) applyObjects(ctx context.Context, objs []*unstructured.Unstructured, real, workloads bool) error {
	// The admin HTTP client: Stop closes its idle connections.
	dyn, err := dynamic.NewForConfigAndClient(c.RESTConfig(), c.httpClient)
	if err != nil {
		return fmt.Errorf("apply manifests: %w", err)
	}
	for _, o := range objs {
		gvr, rbac, ok := kindResource(o.GetKind())
		if !ok {
			return fmt.Errorf("apply manifests: %s %s: kind unknown to the harness", o.GetKind(), o.GetName())
		}
		if !rbac && !workloads {
			continue
		}
		opts := metav1.ApplyOptions{FieldManager: fieldManager, Force: true}
		if !rbac && !real {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		var ri dynamic.ResourceInterface = dyn.Resource(gvr)
		if ns := o.GetNamespace(); ns != "" {
			ri = dyn.Resource(gvr).Namespace(ns)
		}
		if _, err := ri.Apply(ctx, o.GetName(), o, opts); err != nil {
			return fmt.Errorf("apply %s %s/%s: %w", o.GetKind(), o.GetNamespace(), o.GetName(), err)
		}
	}
	return nil
}

// AgentKubeconfig installs the RBAC objects (see [Cluster.InstallRBAC]) and
// returns a kubeconfig with a token of the agent's ServiceAccount
// (kube-system/cellium-agent): the agent runs with exactly the chart's
// permissions, never as system:masters.
//
// Errors: as InstallRBAC and [Cluster.ServiceAccountKubeconfig].
func (c *Cluster) AgentKubeconfig(ctx context.Context) (string, error) {
	if err := c.InstallRBAC(ctx); err != nil {
		return "", err
	}
	return c.ServiceAccountKubeconfig(ctx, install.Namespace, install.AgentServiceAccount)
}

// OperatorKubeconfig is [Cluster.AgentKubeconfig] for the operator's
// ServiceAccount (kube-system/cellium-operator).
func (c *Cluster) OperatorKubeconfig(ctx context.Context) (string, error) {
	if err := c.InstallRBAC(ctx); err != nil {
		return "", err
	}
	return c.ServiceAccountKubeconfig(ctx, install.Namespace, install.OperatorServiceAccount)
}

// saTokenLifetime is how long the tokens of ServiceAccountKubeconfig are
// valid: longer than any test run or `make up` session is expected to last.
const saTokenLifetime = 365 * 24 * 60 * 60

// ServiceAccountKubeconfig asks the API server for a token of the
// ServiceAccount namespace/name (TokenRequest, valid for a year) and writes
// a kubeconfig with it to the work directory, kubeconfig-<namespace>-<name>,
// whose path it returns. A client with it is the user
// system:serviceaccount:<namespace>:<name> in the groups
// system:serviceaccounts and system:serviceaccounts:<namespace>, and has
// the permissions bound to them, no more. A second call for the same
// account returns the file written by the first; a file left by an earlier
// cluster in the same directory is overwritten (its token is not valid for
// this cluster's signing key).
//
// Errors: the ServiceAccount does not exist; the kubeconfig cannot be
// written.
func (c *Cluster) ServiceAccountKubeconfig(ctx context.Context, namespace, name string) (string, error) {
	path := filepath.Join(c.dir, "kubeconfig-"+namespace+"-"+name)
	c.rbacMu.Lock()
	defer c.rbacMu.Unlock()
	if c.saKubeconfigs[path] {
		return path, nil
	}
	exp := int64(saTokenLifetime)
	tr, err := c.clientset.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}},
		metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token of service account %s/%s: %w", namespace, name, err)
	}
	user := "system:serviceaccount:" + namespace + ":" + name
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["cellium"] = &clientcmdapi.Cluster{Server: c.apiURL, CertificateAuthorityData: c.pki.caCert}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	cfg.Contexts["cellium"] = &clientcmdapi.Context{Cluster: "cellium", AuthInfo: user}
	cfg.CurrentContext = "cellium"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return "", fmt.Errorf("write kubeconfig of %s: %w", user, err)
	}
	if c.saKubeconfigs == nil {
		c.saKubeconfigs = map[string]bool{}
	}
	c.saKubeconfigs[path] = true
	return path, nil
}

// CACertFile is the path of the cluster CA's certificate (PEM) in the work
// directory: the CA that signed the API server's serving certificate and
// every client certificate the harness issues. A kubelet trusts it as its
// client CA.
func (c *Cluster) CACertFile() string { return c.pki.path(caCertFile) }

// ClientCertKubeconfig issues a client certificate signed by the cluster's
// CA for user in groups (the certificate's common name and organisations,
// which is how the API server authenticates it) and writes a kubeconfig
// with it to the work directory, kubeconfig-<name>, whose path it returns.
// It gives the least privilege a component has in a real cluster:
// "system:kube-scheduler" for the scheduler (bound by the default RBAC
// policy), "system:node:<node>" in "system:nodes" for a kubelet (authorised
// by the Node authorizer, if the API server runs it).
//
// Errors: the certificate cannot be issued; the kubeconfig cannot be
// written.
func (c *Cluster) ClientCertKubeconfig(name, user string, groups ...string) (string, error) {
	cert, key, err := c.pki.signClient(user, groups)
	if err != nil {
		return "", fmt.Errorf("kubeconfig of %s: %w", user, err)
	}
	path := filepath.Join(c.dir, "kubeconfig-"+name)
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["cellium"] = &clientcmdapi.Cluster{Server: c.apiURL, CertificateAuthorityData: c.pki.caCert}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key}
	cfg.Contexts["cellium"] = &clientcmdapi.Context{Cluster: "cellium", AuthInfo: user}
	cfg.CurrentContext = "cellium"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return "", fmt.Errorf("write kubeconfig of %s: %w", user, err)
	}
	return path, nil
}
