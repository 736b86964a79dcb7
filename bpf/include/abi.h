/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * abi.h: cellium BPF ABI v1, the numbers shared with the Go side
 * (datapath/maps) and the monitor: message types, drop reasons, trace
 * observation points, verdicts and metric directions. The numbers are
 * Cilium's (bpf/lib/common.h, pkg/monitor/api) wherever Cilium has one.
 */
#ifndef CELLIUM_ABI_H
#define CELLIUM_ABI_H

/* Address families of ipcache and endpoint keys and of events. */
#define CELLIUM_AF_INET 2
#define CELLIUM_AF_INET6 10

/* Reserved identities. */
#define IDENTITY_HOST 1
#define IDENTITY_WORLD 2
#define IDENTITY_HEALTH 4
#define IDENTITY_REMOTE_NODE 6
/* The highest reserved identity a tunnel packet may carry in its VNI
 * (1 host ... 8 ingress); cluster identities start at 256. */
#define IDENTITY_RESERVED_MAX 8
/* The local scope of identities (CIDR identities): 1 << 24. */
#define IDENTITY_SCOPE_LOCAL 0x01000000

/* struct event.type: Cilium's monitor message types. */
#define EVENT_DROP 1           /* CILIUM_NOTIFY_DROP */
#define EVENT_TRACE 4          /* CILIUM_NOTIFY_TRACE */
#define EVENT_POLICY_VERDICT 5 /* CILIUM_NOTIFY_POLICY_VERDICT */

/* Drop reasons (struct event.reason of drops, struct metrics_key.reason),
 * Cilium's codes without the sign. 0 is "forwarded" in metrics. */
#define REASON_FORWARDED 0
#define DROP_INVALID_SMAC 130     /* Invalid source mac */
#define DROP_INVALID_SIP 132      /* Invalid source ip */
#define DROP_POLICY 133           /* Policy denied */
#define DROP_INVALID 134          /* Invalid packet */
#define DROP_CT_INVALID_HDR 135   /* CT: Truncated or invalid header */
#define DROP_UNKNOWN_L3 139       /* Unsupported L3 protocol */
/* The kube-proxy replacement (bpf/nodeport.c, nodeport.h) could not
 * rewrite a packet it translates. */
#define DROP_WRITE_ERROR 141      /* Error writing to packet */
/* Tunnel (overlay) drops, bpf/overlay.c. */
#define DROP_NO_TUNNEL_KEY 147    /* Error retrieving tunnel key */
/* A tunnel packet for an address of this node's pods that has no local
 * endpoint, or for another node's pod: it is not for this node. */
#define DROP_UNKNOWN_TARGET 150   /* Unknown L3 target address */
#define DROP_CT_CREATE_FAILED 155 /* CT: Map insertion failed */
/* A packet from outside the node to a NodePort, LoadBalancer or
 * externalIP frontend without backends (bpf/nodeport.c). */
#define DROP_NO_SERVICE 158       /* Service backend not found */
/* A packet routed into the tunnel device whose destination has no
 * tunnel endpoint (a node) in the ipcache. */
#define DROP_NO_TUNNEL_ENDPOINT 160 /* No tunnel/encapsulation endpoint (datapath BUG!) */
/* bpf/nodeport.c found no free SNAT port for a new connection. */
#define DROP_NAT_NO_MAPPING 167   /* No mapping for NAT masquerade */
/* bpf/nodeport.c found no route to a translated packet's destination. */
#define DROP_NO_FIB 169           /* FIB lookup failed */
/* A tunnel packet whose VNI is not a known security identity. */
#define DROP_INVALID_IDENTITY 171 /* Invalid identity */
/* A tunnel packet whose outer source address is not a node's. */
#define DROP_UNKNOWN_SENDER 172   /* Unknown sender */
/* A pod sent a packet to a Service frontend address (a ClusterIP) that
 * the socket load balancer did not translate: a raw socket, a ping
 * socket, a tun device's stack. Dropped before conntrack and policy,
 * which would otherwise see the address as world (bpf/README.md). */
#define DROP_IS_CLUSTER_IP 174    /* Is a ClusterIP */
#define DROP_FRAG_NOT_FOUND 175   /* First logical datagram fragment not found */
/* A packet from outside the node to a LoadBalancer frontend with
 * loadBalancerSourceRanges from a client none of them holds
 * (bpf/nodeport.c). */
#define DROP_NOT_IN_SRC_RANGE 177 /* Denied by LB src range check */
#define DROP_POLICY_DENY 181      /* Policy denied by denylist */

/* Trace observation points (struct event.reason of traces): Cilium's
 * TRACE_* numbers. */
#define TRACE_TO_LXC 0
#define TRACE_TO_PROXY 1
#define TRACE_TO_HOST 2
#define TRACE_TO_STACK 3
#define TRACE_TO_OVERLAY 4
#define TRACE_FROM_LXC 5
#define TRACE_FROM_OVERLAY 9

/* struct event.version: the layout of the record (datapath/maps
 * DecodeEvent). 0 is version 1 (72 bytes, before the field existed: its
 * byte was padding, always zero); 2 adds tcp_flags, icmp_type, icmp_code,
 * flags and the original destination (80 bytes). */
#define EVENT_VERSION 2

/* struct event.flags. */
#define EVENT_F_REPLY (1 << 0)       /* conntrack saw a reply */
#define EVENT_F_REPLY_KNOWN (1 << 1) /* conntrack was consulted: EVENT_F_REPLY is meaningful */
#define EVENT_F_ORIG_DST (1 << 2)    /* orig_daddr/orig_dport hold the destination before translation */

/* MONITOR_AGGREGATION levels, Cilium's numbers (--monitor-aggregation):
 * at LOWEST and above the traces of packets arriving at an observation
 * point (from-endpoint, from-overlay) are not sent; at MEDIUM and above a
 * packet of a connection is traced only when its conntrack entry has news
 * (the first packet each way, a report TCP flag seen for the first time
 * in its direction, or MONITOR_REPORT_INTERVAL since the last report). */
#define MONITOR_AGG_NONE 0
#define MONITOR_AGG_LOWEST 1
#define MONITOR_AGG_LOW 2
#define MONITOR_AGG_MEDIUM 3
#define MONITOR_AGG_MAX 4

/* struct event.verdict of policy verdict events. */
#define VERDICT_ALLOWED 1
#define VERDICT_DENIED 2
#define VERDICT_AUDIT 3

/* Directions of metrics and events: Cilium's METRIC_INGRESS/EGRESS. */
#define METRIC_INGRESS 1
#define METRIC_EGRESS 2

/* policy_key.egress. */
#define POLICY_INGRESS 0
#define POLICY_EGRESS 1

/* Prefix lengths of policy keys: 32 bits of identity and 8 of direction
 * are always matched, then 8 bits of protocol and 16 of port. */
#define POLICY_STATIC_PREFIX 40
#define POLICY_FULL_PREFIX 64

/* ipcache keys: 32 bits of pad1/pad2/family, then the address. */
#define IPCACHE_STATIC_PREFIX 32

/* ipcache_value.flags. */
/* The address is a Service frontend the socket load balancer translates
 * (set only while it is on): a packet a pod sends to it untranslated
 * drops with DROP_IS_CLUSTER_IP. */
#define IPCACHE_F_SERVICE (1 << 0)

/* Conntrack lifetimes (seconds), Cilium's defaults. */
#define CT_LIFETIME_TCP 21600
#define CT_LIFETIME_SYN 60
#define CT_LIFETIME_NONTCP 60
#define CT_LIFETIME_CLOSE 10

/* How long a reply may pass on an entry's word alone: after this long
 * since the entry's last policy check, the next reply checks the policy
 * of the connection's own direction again (bpf/README.md). */
#define CT_REPLY_RECHECK_NS 1000000000ULL

/* ct4_key.dir: the hook whose policy admitted the connection. */
#define CT_DIR_INGRESS 0 /* cil_to_container: the endpoint accepted it */
#define CT_DIR_EGRESS 1  /* cil_from_container: the endpoint opened it */

/* ct_entry.flags. */
#define CT_F_REPLY_SEEN (1 << 0) /* a packet went the other way */
#define CT_F_CLOSING (1 << 1)    /* TCP RST seen, or a FIN each way */
#define CT_F_SYN (1 << 2)        /* created by a TCP SYN */
#define CT_F_AUDIT (1 << 3)      /* admitted by audit mode, not by policy */
/* The connection's last packet in its own direction reached the endpoint
 * through the host stack (cil_to_container), not the same-node tail call:
 * the stack may have translated it (kube-proxy's DNAT, a hostPort), so
 * its replies go back through the stack, never redirect_local. */
#define CT_F_VIA_STACK (1 << 4)
#define CT_F_TX_FIN (1 << 5)  /* FIN seen in the connection's own direction */
#define CT_F_RX_FIN (1 << 6)  /* FIN seen in the reply direction */
/* The last policy check of the connection's own direction denied it:
 * replies drop until a later check allows it again. */
#define CT_F_DENIED (1 << 7)
#define CT_F_DENYLIST (1 << 8) /* ... and the denial was a deny rule (181) */

#endif /* CELLIUM_ABI_H */
