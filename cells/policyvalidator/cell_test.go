package policyvalidator

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/cilium/statedb"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	api "github.com/cellium/cellium/api/policy"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/k8s/k8stest"
	"github.com/cellium/cellium/cells/leaderelection"
	"github.com/cellium/cellium/cells/policy"
	k8stables "github.com/cellium/cellium/statedb/k8s"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("k8s.io/klog/v2.(*loggingT).flushDaemon"))
}

func TestCellConfig(t *testing.T) {
	var cfg Config
	if err := hivetest.New(t, nil, Cell, hive.Provide(func() k8s.Clientset { return k8stest.NewClientset() }),
		hive.Provide(
			k8stables.NewCNPsTable, statedb.RWTable[*ciliumv2.CiliumNetworkPolicy].ToTable,
			k8stables.NewCCNPsTable, statedb.RWTable[*ciliumv2.CiliumClusterwideNetworkPolicy].ToTable,
		), hivetest.Capture(&cfg)).Populate(); err != nil {
		t.Fatal(err)
	}
	if !cfg.ValidateNetworkPolicy {
		t.Errorf("defaults %+v, want validation on (Cilium's default)", cfg)
	}
}

// TestCellWritesConditions runs the cell as the leader against a fake API
// server whose CNPs and CCNPs the tables mirror: a valid CNP gets
// Valid=True and Supported=True, one with an invalid field Valid=False
// naming the field (the valid one is untouched), a CCNP with HTTP rules
// Supported=False (L7RulesNotEnforced); fixing the invalid CNP turns it
// Valid; a condition of another type written by someone else is kept.
func TestCellWritesConditions(t *testing.T) {
	cs := k8stest.NewClientset()
	var (
		db    *statedb.DB
		cnps  statedb.RWTable[*ciliumv2.CiliumNetworkPolicy]
		ccnps statedb.RWTable[*ciliumv2.CiliumClusterwideNetworkPolicy]
	)
	h := hivetest.New(t, []string{"--leader-election=false"},
		hive.Provide(
			func() k8s.Clientset { return cs },
			k8stables.NewCNPsTable, statedb.RWTable[*ciliumv2.CiliumNetworkPolicy].ToTable,
			k8stables.NewCCNPsTable, statedb.RWTable[*ciliumv2.CiliumClusterwideNetworkPolicy].ToTable,
		),
		leaderelection.Cell, Cell,
		hivetest.Capture(&db), hivetest.Capture(&cnps), hivetest.Capture(&ccnps),
	)
	if err := h.Populate(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	v2 := cs.Cilium().CiliumV2()
	web := &api.EndpointSelector{MatchLabels: map[string]string{"app": "web"}}
	ingress := func(pp api.PortProtocol, l7 *api.L7Rules) []api.IngressRule {
		return []api.IngressRule{{ToPorts: api.PortRules{{Ports: []api.PortProtocol{pp}, Rules: l7}}}}
	}
	good := &ciliumv2.CiliumNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "good", Namespace: "a", UID: "u-good"},
		Spec: &api.Rule{EndpointSelector: web, Ingress: ingress(api.PortProtocol{Port: "80", Protocol: api.ProtoTCP}, nil)}}
	good.Status.Conditions = []ciliumv2.NetworkPolicyCondition{{Type: "Other", Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
	bad := &ciliumv2.CiliumNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "bad", Namespace: "a", UID: "u-bad"},
		Specs: api.Rules{
			{EndpointSelector: web, Ingress: ingress(api.PortProtocol{Port: "80", Protocol: api.ProtoTCP}, nil)},
			{EndpointSelector: web, Ingress: ingress(api.PortProtocol{Port: "80", EndPort: 70, Protocol: api.ProtoTCP}, nil)},
		}}
	l7 := &ciliumv2.CiliumClusterwideNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "l7", UID: "u-l7"},
		Spec: &api.Rule{EndpointSelector: web, Ingress: ingress(api.PortProtocol{Port: "80", Protocol: api.ProtoTCP},
			&api.L7Rules{HTTP: []api.PortRuleHTTP{{Method: "GET"}}})}}
	for _, o := range []*ciliumv2.CiliumNetworkPolicy{good, bad} {
		if _, err := v2.CiliumNetworkPolicies("a").Create(ctx, o, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := v2.CiliumClusterwideNetworkPolicies().Create(ctx, l7, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	k8stest.Mirror(t, db, cnps, v2.CiliumNetworkPolicies(""), k8stest.Closed())
	k8stest.Mirror(t, db, ccnps, v2.CiliumClusterwideNetworkPolicies(), k8stest.Closed())
	if err := h.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})

	// want checks one condition of a status.
	want := func(conds []ciliumv2.NetworkPolicyCondition, typ ciliumv2.PolicyConditionType, status corev1.ConditionStatus, reason, msg string) error {
		for _, c := range conds {
			if c.Type == typ {
				if c.Status != status || (reason != "" && c.Reason != reason) || !strings.Contains(c.Message, msg) || c.LastTransitionTime.IsZero() {
					return fmt.Errorf("%s = %+v, want %s %s %q", typ, c, status, reason, msg)
				}
				return nil
			}
		}
		return fmt.Errorf("no %s in %+v", typ, conds)
	}
	cnp := func(name string) []ciliumv2.NetworkPolicyCondition {
		o, err := v2.CiliumNetworkPolicies("a").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return o.Status.Conditions
	}
	k8stest.Eventually(t, "the conditions of good, bad and l7", func() error {
		o, err := v2.CiliumClusterwideNetworkPolicies().Get(ctx, "l7", metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, err := range []error{
			want(cnp("good"), ciliumv2.PolicyConditionValid, corev1.ConditionTrue, "", "Policy validation succeeded"),
			want(cnp("good"), policy.ConditionSupported, corev1.ConditionTrue, policy.ReasonSupported, ""),
			want(cnp("good"), "Other", corev1.ConditionTrue, "", ""),
			want(cnp("bad"), ciliumv2.PolicyConditionValid, corev1.ConditionFalse, "", "specs[1]: ingress[0].toPorts[0].ports[0]: endPort 70 is below port 80"),
			want(o.Status.Conditions, ciliumv2.PolicyConditionValid, corev1.ConditionTrue, "", ""),
			want(o.Status.Conditions, policy.ConditionSupported, corev1.ConditionFalse, policy.ReasonL7NotEnforced, "spec.ingress[0].toPorts[0].rules.http"),
		} {
			if err != nil {
				return err
			}
		}
		return nil
	})

	// Fixing the bad policy (a new generation) makes it valid.
	fixed, err := v2.CiliumNetworkPolicies("a").Get(ctx, "bad", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fixed.Specs[1].Ingress[0].ToPorts[0].Ports[0].EndPort = 90
	if _, err := v2.CiliumNetworkPolicies("a").Update(ctx, fixed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	k8stest.Eventually(t, "the fixed policy valid", func() error {
		return want(cnp("bad"), ciliumv2.PolicyConditionValid, corev1.ConditionTrue, "", "Policy validation succeeded")
	})
}
