package harness_test

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cellium/cellium/test/harness"
)

// Start a cluster outside of a test (tests use harness.ForTest) and list its
// namespaces.
func ExampleStart() {
	ctx := context.Background()
	c, err := harness.Start(ctx, harness.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Stop()

	// c.Kubeconfig() is a file for kubectl; c.Clientset() and c.RESTConfig()
	// are for Go clients.
	nss, err := c.Clientset().CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, ns := range nss.Items {
		fmt.Println(ns.Name)
	}
	// Output:
	// default
	// kube-node-lease
	// kube-public
	// kube-system
}
