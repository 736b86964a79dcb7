// Package lbhealthserver answers the healthCheckNodePort of Services with
// externalTrafficPolicy Local, as kube-proxy and Cilium's
// pkg/loadbalancer/healthserver do, when the agent replaces kube-proxy
// (--kube-proxy-replacement=true, --enable-health-check-nodeport): for
// each such Service of type LoadBalancer or NodePort it listens on the
// node at spec.healthCheckNodePort and answers every HTTP request with
// {"service":{"namespace":..,"name":..},"localEndpoints":N}, status 200
// when N, the Service's ready endpoints on this node, is at least one and
// 503 when it is none. An external load balancer's health check then
// sends traffic only to nodes that have local backends.
//
// It reads the k8s-services and k8s-endpoint-slices tables only; ports
// open and close as Services come, change and go. A port it cannot bind
// (taken by another process, or by another Service's healthCheckNodePort)
// is logged, reported as the module's degraded health (cellium status)
// and retried, without disturbing the other ports.
package lbhealthserver
