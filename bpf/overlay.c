// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * overlay.c: cellium's programs for the node's tunnel device, cilium_vxlan
 * (a VXLAN device in external, collect-metadata mode; routing mode
 * "tunnel", Documentation/concepts/routing.md).
 *
 *   cil_to_overlay    tcx egress of cilium_vxlan: a packet the node routed
 *                     into the tunnel (a remote pod CIDR's route). Its
 *                     destination's ipcache entry names the node to send it
 *                     to; the VNI carries the security identity of its
 *                     source.
 *   cil_from_overlay  tcx ingress of cilium_vxlan: a decapsulated packet.
 *                     The outer source must be a node, the VNI a known
 *                     identity; a packet for a local endpoint goes to that
 *                     endpoint's ingress policy (cil_lxc_policy, through
 *                     cellium_policy_progs) with the VNI's identity.
 */
#include "include/bpf_api.h"
#include "include/net.h"
#include "include/abi.h"
#include "include/maps.h"
#include "include/metrics.h"
#include "include/nodeport.h"

volatile const __u8 TRACE_ENABLED = 0;
/* --monitor-aggregation (MONITOR_AGG_*, abi.h) and the TCP flags that
 * are news at MEDIUM and above (--monitor-aggregation-flags). */
volatile const __u8 MONITOR_AGGREGATION = 0;
volatile const __u8 MONITOR_REPORT_FLAGS = 0x07; /* FIN, SYN, RST */
/* DELIVER_VIA_STACK is set when kube-proxy translates the pods' Service
 * connections in the host stack (the socket load balancer is off): a
 * decapsulated packet for a local endpoint then goes up the stack instead
 * of straight to the endpoint's policy program, so that netfilter's
 * conntrack reverses kube-proxy's DNAT on the replies of a pod's
 * connection to a ClusterIP whose backend is on another node (the
 * endpoint's cil_to_container still applies its ingress policy). Cilium
 * does the same without BPF host routing. */
volatile const __u8 DELIVER_VIA_STACK = 0;

/* skb->cb slot carrying the source identity into cil_lxc_policy (as the
 * same-node redirect of bpf/lxc.c does). */
#define CB_SRC_IDENTITY 0

/* The inner packet, for lookups and events. */
struct opkt {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 family;
	__u8 tcp_flags;
	__u8 pad;
	__u8 icmp_type;
	__u8 icmp_code;
	__u16 pad2;
	__u32 src_identity;
	__u32 dst_identity;
};

/* parse_inner reads the inner IPv4 header (and, for events only, the
 * ports and flags of TCP, the ports of UDP and the type and code of ICMP
 * when they are in the linear area and the packet is not a later
 * fragment). It returns 0 or a drop reason. */
static __always_inline int parse_inner(struct __sk_buff *skb, struct opkt *p)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u8 *ip = data + ETH_HLEN, *l4;
	__u32 ihl;

	if ((void *)(ip + 20) > data_end) {
		skb_pull_data(skb, ETH_HLEN + 20);
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
		ip = data + ETH_HLEN;
		if ((void *)(ip + 20) > data_end)
			return DROP_INVALID;
	}
	if (bpf_ntohs(*(__be16 *)(data + 12)) != ETH_P_IP)
		return DROP_UNKNOWN_L3;
	if ((ip[0] >> 4) != 4)
		return DROP_INVALID;
	ihl = (ip[0] & 0x0f) * 4;
	if (ihl < 20)
		return DROP_INVALID;
	p->family = CELLIUM_AF_INET;
	p->proto = ip[9];
	p->saddr = *(__be32 *)(ip + 12);
	p->daddr = *(__be32 *)(ip + 16);
	l4 = ip + ihl;
	/* A later fragment's first bytes are data, not a header. */
	if (bpf_ntohs(*(__be16 *)(ip + 6)) & 0x1fff)
		return 0;
	if ((p->proto == IPPROTO_TCP || p->proto == IPPROTO_UDP) && (void *)(l4 + 4) <= data_end) {
		p->sport = *(__be16 *)l4;
		p->dport = *(__be16 *)(l4 + 2);
	}
	if (p->proto == IPPROTO_TCP && (void *)(l4 + 14) <= data_end)
		p->tcp_flags = l4[13];
	if (p->proto == IPPROTO_ICMP && (void *)(l4 + 2) <= data_end) {
		p->icmp_type = l4[0];
		p->icmp_code = l4[1];
	}
	return 0;
}

static __always_inline struct ipcache_value *ipcache_lookup4(__be32 addr)
{
	struct ipcache_key key = {
		.prefixlen = IPCACHE_STATIC_PREFIX + 32,
		.family = CELLIUM_AF_INET,
		.ip = { addr },
	};

	return map_lookup_elem(&cellium_ipcache, &key);
}

static __always_inline void emit(struct __sk_buff *skb, const struct opkt *p, __u8 type, __u8 reason,
				 __u8 dir)
{
	struct event *e = ringbuf_reserve(&cellium_events, sizeof(*e), 0);

	if (!e) {
		events_lost();
		return;
	}
	__builtin_memset(e, 0, sizeof(*e));
	e->type = type;
	e->reason = reason;
	e->dir = dir;
	e->proto = p->proto;
	e->family = p->family;
	e->src_identity = p->src_identity;
	e->dst_identity = p->dst_identity;
	e->saddr[0] = p->saddr;
	e->daddr[0] = p->daddr;
	e->sport = p->sport;
	e->dport = p->dport;
	e->ifindex = skb->ifindex;
	e->orig_len = skb->len;
	e->version = EVENT_VERSION;
	e->tcp_flags = p->tcp_flags;
	e->icmp_type = p->icmp_type;
	e->icmp_code = p->icmp_code;
	/* No conntrack here: EVENT_F_REPLY_KNOWN stays clear. */
	e->ktime_ns = ktime_get_ns();
	ringbuf_submit(e, 0);
}

/* trace sends a trace event of a passed packet at obs as
 * --monitor-aggregation allows: at LOWEST and above not where a packet
 * arrives (from-overlay); at MEDIUM and above, with no conntrack here to
 * tell a flag seen for the first time, only a TCP packet carrying one of
 * the report flags that open or close a connection (SYN, FIN, RST), so
 * to-overlay shows connections open and close. Report flags such as ACK
 * or PSH (--monitor-aggregation-flags=all, the chart's default) would
 * trace every packet: Hubble's own flows to hubble-relay cross the tunnel,
 * and each traced packet would make more of them. */
#define OVERLAY_NEWS_FLAGS 0x07 /* FIN, SYN, RST */
static __always_inline void trace(struct __sk_buff *skb, const struct opkt *p, __u8 dir, __u8 obs)
{
	if (!TRACE_ENABLED)
		return;
	if (MONITOR_AGGREGATION >= MONITOR_AGG_LOWEST && obs == TRACE_FROM_OVERLAY)
		return;
	if (MONITOR_AGGREGATION >= MONITOR_AGG_MEDIUM && !(p->tcp_flags & MONITOR_REPORT_FLAGS & OVERLAY_NEWS_FLAGS))
		return;
	emit(skb, p, EVENT_TRACE, obs, dir);
}

static __always_inline int drop(struct __sk_buff *skb, const struct opkt *p, __u8 reason, __u8 dir)
{
	count(skb->len, reason, dir);
	emit(skb, p, EVENT_DROP, reason, dir);
	return TC_ACT_SHOT;
}

static __always_inline int pass(struct __sk_buff *skb, const struct opkt *p, __u8 dir, __u8 obs)
{
	count(skb->len, REASON_FORWARDED, dir);
	trace(skb, p, dir, obs);
	return TC_ACT_OK;
}

/* cil_to_overlay sets the tunnel key of a packet leaving through the
 * tunnel device: the remote node is the tunnel endpoint of the inner
 * destination's ipcache entry, the VNI the ipcache identity of the inner
 * source (a local pod's identity; host for the node's own addresses). A
 * destination without a tunnel endpoint drops: the route sent it here,
 * but no node is known to hold it. */
SEC("tcx/egress")
int cil_to_overlay(struct __sk_buff *skb)
{
	struct bpf_tunnel_key key = {};
	struct ipcache_value *v;
	struct opkt p = {};
	int ret;

	ret = parse_inner(skb, &p);
	if (ret)
		return drop(skb, &p, ret, METRIC_EGRESS);
	v = ipcache_lookup4(p.saddr);
	p.src_identity = v ? v->sec_identity : IDENTITY_WORLD;
	v = ipcache_lookup4(p.daddr);
	if (!v || !v->tunnel_endpoint)
		return drop(skb, &p, DROP_NO_TUNNEL_ENDPOINT, METRIC_EGRESS);
	p.dst_identity = v->sec_identity;
	key.remote_ipv4 = bpf_ntohl(v->tunnel_endpoint);
	key.tunnel_id = p.src_identity;
	key.tunnel_ttl = 64;
	if (skb_set_tunnel_key(skb, &key, sizeof(key), BPF_F_ZERO_CSUM_TX) < 0)
		return drop(skb, &p, DROP_NO_TUNNEL_KEY, METRIC_EGRESS);
	return pass(skb, &p, METRIC_EGRESS, TRACE_TO_OVERLAY);
}

/* vni_known reports whether a VNI names an identity this node knows: a
 * reserved one, one of the cluster's (cellium_identities), or the
 * identity the ipcache gives the inner source (so a pod that appeared on
 * another node is accepted as soon as the ipcache has it, even before its
 * identity reached cellium_identities). */
static __always_inline int vni_known(__u32 vni, __u32 inner_src_id)
{
	if (vni == 0 || vni > 0xffffff)
		return 0;
	if (vni <= IDENTITY_RESERVED_MAX || vni == inner_src_id)
		return 1;
	return map_lookup_elem(&cellium_identities, &vni) != 0;
}

/* cil_from_overlay checks a decapsulated packet and delivers it:
 *   1. the outer source (the tunnel key's remote address) must be a node:
 *      its ipcache identity is remote-node or host, else 172;
 *   2. the VNI must be a known identity (vni_known), else 171; host from
 *      another node becomes remote-node;
 *   3. a packet for a local endpoint tail-calls that endpoint's
 *      cil_lxc_policy with the VNI's identity (with DELIVER_VIA_STACK it
 *      goes to the stack and the endpoint's cil_to_container) (an empty slot: the stack
 *      and the endpoint's cil_to_container, which takes the identity from
 *      the ipcache); for the node itself (host identity) or its health
 *      endpoint (health identity, no tunnel endpoint) it goes to the
 *      stack; for anything else (another node's pod, an address of this
 *      node's pod CIDR without endpoint, the world) it drops with 150. */
SEC("tcx/ingress")
int cil_from_overlay(struct __sk_buff *skb)
{
	struct endpoint_key ekey = { .family = CELLIUM_AF_INET };
	struct bpf_tunnel_key key = {};
	struct endpoint_info *info;
	struct ipcache_value *v;
	struct opkt p = {};
	__u32 outer_id, src_id, inner_src_id;
	int ret;

	ret = parse_inner(skb, &p);
	if (ret)
		return drop(skb, &p, ret, METRIC_INGRESS);
	if (skb_get_tunnel_key(skb, &key, sizeof(key), 0) < 0)
		return drop(skb, &p, DROP_NO_TUNNEL_KEY, METRIC_INGRESS);

	v = ipcache_lookup4(bpf_htonl(key.remote_ipv4));
	outer_id = v ? v->sec_identity : IDENTITY_WORLD;
	if (outer_id != IDENTITY_REMOTE_NODE && outer_id != IDENTITY_HOST) {
		p.src_identity = outer_id;
		return drop(skb, &p, DROP_UNKNOWN_SENDER, METRIC_INGRESS);
	}

	v = ipcache_lookup4(p.saddr);
	inner_src_id = v ? v->sec_identity : IDENTITY_WORLD;
	src_id = key.tunnel_id;
	p.src_identity = src_id;
	if (!vni_known(src_id, inner_src_id))
		return drop(skb, &p, DROP_INVALID_IDENTITY, METRIC_INGRESS);
	if (src_id == IDENTITY_HOST)
		src_id = IDENTITY_REMOTE_NODE;
	p.src_identity = src_id;

	/* The inner frame carries the sending node's tunnel device MAC:
	 * make the stack take it as its own. */
	skb_change_type(skb, PACKET_HOST);

	ekey.ip[0] = p.daddr;
	info = map_lookup_elem(&cellium_lxc, &ekey);
	if (info) {
		p.dst_identity = info->sec_identity;
		if (DELIVER_VIA_STACK)
			return pass(skb, &p, METRIC_INGRESS, TRACE_FROM_OVERLAY);
		count(skb->len, REASON_FORWARDED, METRIC_INGRESS);
		trace(skb, &p, METRIC_INGRESS, TRACE_FROM_OVERLAY);
		skb->cb[CB_SRC_IDENTITY] = src_id;
		tail_call(skb, &cellium_policy_progs, info->lxc_id);
		skb->cb[CB_SRC_IDENTITY] = 0;
		return TC_ACT_OK;
	}
	v = ipcache_lookup4(p.daddr);
	p.dst_identity = v ? v->sec_identity : IDENTITY_WORLD;
	/* The node itself, and its health endpoint (answered by the node's
	 * stack when it is not in cellium_lxc). */
	if (v && !v->tunnel_endpoint && (p.dst_identity == IDENTITY_HOST || p.dst_identity == IDENTITY_HEALTH)) {
		/* A backend's reply to a connection bpf/nodeport.c translated
		 * on this node (source NAT to the node's address): translated
		 * back and sent to the client. */
		if (p.dst_identity == IDENTITY_HOST) {
			ret = nodeport_rev_nat(skb, METRIC_INGRESS, 1);
			if (ret != NP_NOT_NAT)
				return ret;
		}
		return pass(skb, &p, METRIC_INGRESS, TRACE_FROM_OVERLAY);
	}
	return drop(skb, &p, DROP_UNKNOWN_TARGET, METRIC_INGRESS);
}

char __license[] SEC("license") = "Dual BSD/GPL";
