package labels_test

import (
	"fmt"

	"github.com/cellium/cellium/statedb/labels"
)

func Example() {
	all := labels.FromK8sPod(
		map[string]string{"app": "web", "pod-template-hash": "5d8f9c"},
		"prod",
		map[string]string{"kubernetes.io/metadata.name": "prod"},
		"web", "cluster1")

	id, info := labels.DefaultFilter().Split(all)
	fmt.Println("identity:", id)
	fmt.Println("info:    ", info)
	fmt.Println("key:     ", id.SortedList())
	// Output:
	// identity: k8s:app=web,k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=prod,k8s:io.cilium.k8s.policy.cluster=cluster1,k8s:io.cilium.k8s.policy.serviceaccount=web,k8s:io.kubernetes.pod.namespace=prod
	// info:     k8s:pod-template-hash=5d8f9c
	// key:      k8s:app=web;k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=prod;k8s:io.cilium.k8s.policy.cluster=cluster1;k8s:io.cilium.k8s.policy.serviceaccount=web;k8s:io.kubernetes.pod.namespace=prod;
}

func ExampleParse() {
	for _, s := range []string{"k8s:app=web", "app=web", "$host", "k8s:a==b", "a=b:c"} {
		l := labels.Parse(s)
		fmt.Printf("%-12s source=%q key=%q value=%q\n", s, l.Source, l.Key, l.Value)
	}
	// Output:
	// k8s:app=web  source="k8s" key="app" value="web"
	// app=web      source="unspec" key="app" value="web"
	// $host        source="reserved" key="host" value=""
	// k8s:a==b     source="k8s" key="a" value="=b"
	// a=b:c        source="a=b" key="c" value=""
}
