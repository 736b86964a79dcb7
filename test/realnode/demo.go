package realnode

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/client/clientset/versioned"
	"github.com/cellium/cellium/test/devkubelet/devnode"
)

// DemoNamespace holds the demo pods of [Cluster.DeployDemo].
const DemoNamespace = "demo"

// DemoPod is a running demo pod and its CiliumEndpoint.
type DemoPod struct {
	Name, App  string
	IP         string
	EndpointID int64
	Identity   int64
	// ServiceIP is the ClusterIP of the Service named after the pod's app
	// (port 8080), which selects the pods of that app.
	ServiceIP string
}

// demoServices are the Services DeployDemo creates, one per app: the
// pods reach each other through their ClusterIPs (the socket load
// balancer).
var demoServices = []string{"web", "db"}

// DemoNodePort is the NodePort of the demo's "web" Service (type
// NodePort): http://<any node's address>:30080/ answers from the machine
// and from every node, through kube-proxy or, with kube-proxy replacement,
// through cellium's datapath.
const DemoNodePort = 30080

// demoPods are the pods DeployDemo creates: name and app label.
var demoPods = [][2]string{{"web-1", "web"}, {"web-2", "web"}, {"db-1", "db"}}

// DeployDemo creates the demo pods (the demo app, HTTP on :8080) in
// DemoNamespace, scheduled by kube-scheduler, and waits (at most timeout)
// until each runs with a Ready CiliumEndpoint. Pods that exist already are
// kept.
//
// Errors: the API server refuses; a pod is not running with a ready
// endpoint in time.
func (c *Cluster) DeployDemo(ctx context.Context, timeout time.Duration) ([]DemoPod, error) {
	cs := c.Control.Clientset()
	_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: DemoNamespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("demo: %w", err)
	}
	never := corev1.PullNever
	for _, p := range demoPods {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: p[0], Namespace: DemoNamespace, Labels: map[string]string{"app": p[1]}},
			Spec: corev1.PodSpec{
				Containers: []corev1.Container{{
					Name: "app", Image: DemoImage, ImagePullPolicy: never,
					Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
				}},
				// The controller-manager makes the namespace's default
				// ServiceAccount a moment after the namespace: no token.
				AutomountServiceAccountToken: new(bool),
			},
		}
		if _, err := cs.CoreV1().Pods(DemoNamespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("demo: create pod %s: %w", p[0], err)
		}
	}
	serviceIPs := map[string]string{}
	for _, app := range demoServices {
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: DemoNamespace},
			Spec: corev1.ServiceSpec{
				Selector: map[string]string{"app": app},
				Ports:    []corev1.ServicePort{{Name: "http", Port: 8080, TargetPort: intstr.FromInt32(8080)}},
			},
		}
		if app == "web" {
			svc.Spec.Type = corev1.ServiceTypeNodePort
			svc.Spec.Ports[0].NodePort = DemoNodePort
		}
		got, err := cs.CoreV1().Services(DemoNamespace).Create(ctx, svc, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			got, err = cs.CoreV1().Services(DemoNamespace).Get(ctx, app, metav1.GetOptions{})
		}
		if err != nil {
			return nil, fmt.Errorf("demo: service %s: %w", app, err)
		}
		serviceIPs[app] = got.Spec.ClusterIP
	}
	cilium, err := versioned.NewForConfig(c.Control.RESTConfig())
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var out []DemoPod
	err = devnode.WaitFor(wctx, nil, func() error {
		out = out[:0]
		for _, p := range demoPods {
			pod, err := cs.CoreV1().Pods(DemoNamespace).Get(wctx, p[0], metav1.GetOptions{})
			if err != nil {
				return err
			}
			if pod.Status.Phase != corev1.PodRunning || pod.Status.PodIP == "" {
				return fmt.Errorf("pod %s is %s", p[0], pod.Status.Phase)
			}
			cep, err := cilium.CiliumV2().CiliumEndpoints(DemoNamespace).Get(wctx, p[0], metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("CiliumEndpoint of %s: %w", p[0], err)
			}
			if cep.Status.State != ciliumv2.EndpointStateReady {
				return fmt.Errorf("CiliumEndpoint of %s is %s", p[0], cep.Status.State)
			}
			d := DemoPod{Name: p[0], App: p[1], IP: pod.Status.PodIP, EndpointID: cep.Status.ID, ServiceIP: serviceIPs[p[1]]}
			if cep.Status.Identity != nil {
				d.Identity = cep.Status.Identity.ID
			}
			out = append(out, d)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("demo pods: %w", err)
	}
	return out, nil
}
