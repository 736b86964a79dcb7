// Package lbipam is the operator's LB IPAM: while this replica leads, it
// hands out addresses from CiliumLoadBalancerIPPools to Services of type
// LoadBalancer (status.loadBalancer.ingress), which the agents then serve
// like NodePorts, and reports on each Service (condition
// cilium.io/IPAMRequestSatisfied) and each pool (cilium.io/IPsTotal,
// IPsAvailable, IPsUsed, PoolConflict, and cellium's PodCIDRConflict with
// an Event). Cilium's names and behaviour; the differences are in
// Documentation/operations/lb-ipam.md.
//
// State (alloc.go) is the allocation logic, without I/O; the controller
// (controller.go) feeds it the Services, pools and CiliumNodes tables and
// writes the outcome to the API server. Allocations live in the Services'
// status: a new leader rebuilds them from there before handing out
// anything.
package lbipam
