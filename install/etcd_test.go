package install_test

import (
	"context"
	"crypto/x509"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/test/harness"
)

// etcdMounts maps each mount path of c to where its files come from:
// "configmap/<name>/<key>=<path>" or "secret/<name>".
func etcdMounts(spec corev1.PodSpec, c corev1.Container) map[string]string {
	out := map[string]string{}
	for _, m := range c.VolumeMounts {
		for _, v := range spec.Volumes {
			switch {
			case v.Name != m.Name:
			case v.ConfigMap != nil:
				for _, it := range v.ConfigMap.Items {
					out[m.MountPath] = "configmap/" + v.ConfigMap.Name + "/" + it.Key + "=" + it.Path
				}
			case v.Secret != nil:
				out[m.MountPath] = "secret/" + v.Secret.SecretName
			}
		}
	}
	return out
}

// etcd.enabled renders Cilium's etcd-config into the ConfigMap
// cilium-config, mounted at /var/lib/etcd-config in agent and operator,
// which get --kvstore-opt etcd.config=/var/lib/etcd-config/etcd.config;
// etcd.ssl adds the TLS files of the Secret cilium-etcd-secrets at
// /var/lib/etcd-secrets. The rendered file, with the Secret's files in
// place, connects to an etcd that requires client certificates.
func TestChartEtcdSSL(t *testing.T) {
	for _, o := range renderObjects(t) {
		if o.GetKind() == "ConfigMap" && o.GetName() == "cilium-config" {
			t.Error("default chart renders cilium-config")
		}
	}

	// A TLS etcd and the Secret's three files in a directory.
	secrets := t.TempDir()
	ca := harness.NewTestCA(t, "etcd-ca")
	harness.WriteTestFile(t, secrets, "etcd-client-ca.crt", ca.PEM)
	c, k := ca.Issue(t, "cilium-etcd-client", x509.ExtKeyUsageClientAuth)
	harness.WriteTestFile(t, secrets, "etcd-client.crt", c)
	harness.WriteTestFile(t, secrets, "etcd-client.key", k)
	srvCert, srvKey := ca.IssueFiles(t, t.TempDir(), "127.0.0.1", x509.ExtKeyUsageServerAuth)
	e := harness.StartEtcd(t, harness.WithEtcdTLS(harness.EtcdTLS{CAFile: filepath.Join(secrets, "etcd-client-ca.crt"),
		CertFile: srvCert, KeyFile: srvKey,
		ClientCertFile: filepath.Join(secrets, "etcd-client.crt"), ClientKeyFile: filepath.Join(secrets, "etcd-client.key")}))

	for _, ssl := range []bool{false, true} {
		set := []string{"etcd.enabled=true", "etcd.endpoints={" + e.URL() + "}"}
		if ssl {
			set = append(set, "etcd.ssl=true")
		}
		objs := renderObjects(t, set...)
		var cm corev1.ConfigMap
		if !find(t, objs, "ConfigMap", "cilium-config", &cm) {
			t.Fatal("no ConfigMap cilium-config")
		}
		file := cm.Data["etcd-config"]
		if !strings.Contains(file, "endpoints:\n  - "+e.URL()) {
			t.Errorf("etcd-config lacks the endpoint:\n%s", file)
		}
		hasTLS := strings.Contains(file, "trusted-ca-file: '/var/lib/etcd-secrets/etcd-client-ca.crt'") &&
			strings.Contains(file, "key-file: '/var/lib/etcd-secrets/etcd-client.key'") &&
			strings.Contains(file, "cert-file: '/var/lib/etcd-secrets/etcd-client.crt'")
		if hasTLS != ssl {
			t.Errorf("etcd.ssl=%v: etcd-config\n%s", ssl, file)
		}
		wantMounts := map[string]string{"/var/lib/etcd-config": "configmap/cilium-config/etcd-config=etcd.config"}
		if ssl {
			wantMounts["/var/lib/etcd-secrets"] = "secret/cilium-etcd-secrets"
		}
		var ds appsv1.DaemonSet
		var dep appsv1.Deployment
		if !find(t, objs, "DaemonSet", "cellium-agent", &ds) || !find(t, objs, "Deployment", "cellium-operator", &dep) {
			t.Fatal("no agent DaemonSet or operator Deployment")
		}
		for name, spec := range map[string]corev1.PodSpec{"agent": ds.Spec.Template.Spec, "operator": dep.Spec.Template.Spec} {
			ctr := spec.Containers[0]
			for _, want := range []string{"--kvstore=etcd", "--kvstore-opt=etcd.config=/var/lib/etcd-config/etcd.config"} {
				if !slices.Contains(ctr.Args, want) {
					t.Errorf("ssl=%v: %s args lack %s", ssl, name, want)
				}
			}
			got := etcdMounts(spec, ctr)
			for p, w := range wantMounts {
				if got[p] != w {
					t.Errorf("ssl=%v: %s mounts %s from %q, want %q", ssl, name, p, got[p], w)
				}
			}
			if _, ok := got["/var/lib/etcd-secrets"]; ok && !ssl {
				t.Errorf("%s mounts the etcd secrets without etcd.ssl", name)
			}
		}
		if !ssl {
			continue
		}
		// The file as the pods see it, with the Secret mounted here.
		path := filepath.Join(t.TempDir(), "etcd.config")
		if err := os.WriteFile(path, []byte(strings.ReplaceAll(file, "/var/lib/etcd-secrets", secrets)), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := kvstore.EtcdConfig(map[string]string{kvstore.OptConfig: path})
		if err != nil {
			t.Fatal(err)
		}
		cl := kvstore.NewClient(hivetest.Logger(t), cfg, time.Minute)
		if err := cl.Start(); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err = cl.Etcd().Put(ctx, "cilium/state/test/helm", "ok")
		cancel()
		_ = cl.Close()
		if err != nil {
			t.Errorf("put with the chart's etcd-config over TLS: %v", err)
		}
	}
}

// The operator runs as a non-root user, and the etcd client files are
// mounted with mode 0400 (Cilium's): with etcd.enabled its pod's fsGroup
// is the operator's group, so that the kubelet hands the files to that
// group (0440) and the operator can read them (it could not on a real
// node: "open /var/lib/etcd-config/etcd.config: permission denied").
// Without etcd, or without a group to give, there is no fsGroup.
func TestChartEtcdOperatorReadsClientFiles(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  []string
		want int64 // 0: no fsGroup
	}{
		{"default", nil, 0},
		{"etcd", []string{"etcd.enabled=true"}, 65532},
		{"etcd+ssl", []string{"etcd.enabled=true", "etcd.ssl=true"}, 65532},
		{"etcd, other group", []string{"etcd.enabled=true", "operator.securityContext.runAsGroup=100000"}, 100000},
		{"etcd, no securityContext", []string{"etcd.enabled=true", "operator.securityContext=null"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var dep appsv1.Deployment
			if !find(t, renderObjects(t, tc.set...), "Deployment", "cellium-operator", &dep) {
				t.Fatal("no operator Deployment")
			}
			spec := dep.Spec.Template.Spec
			var got int64
			if sc := spec.SecurityContext; sc != nil && sc.FSGroup != nil {
				got = *sc.FSGroup
			}
			if got != tc.want {
				t.Fatalf("operator fsGroup %d, want %d (0: none)", got, tc.want)
			}
			if tc.want == 0 {
				return
			}
			if sc := spec.Containers[0].SecurityContext; sc == nil || sc.RunAsGroup == nil || *sc.RunAsGroup != got || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
				t.Errorf("operator container securityContext %+v: want a non-root user in group %d", sc, got)
			}
		})
	}
}
