// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * nodeport.c: the kube-proxy replacement for traffic from outside the
 * node, on the node's uplink devices (Cilium's bpf_host "from-netdev").
 *
 *   cil_from_netdev  tcx ingress of an uplink device (--devices): a packet
 *                    to a NodePort, LoadBalancer or externalIP frontend
 *                    (cellium_lb4_services, scope LB4_SCOPE_EXT, slot 0
 *                    flagged LB4_SVC_NODEPORT) is sent to one of its
 *                    backends (the client's with session affinity, else
 *                    at random or, with --bpf-lb-algorithm=maglev, the
 *                    one of its 5-tuple's slot in the frontend's Maglev
 *                    table, include/maglev.h): destination translated to the backend,
 *                    and, with externalTrafficPolicy Cluster, source
 *                    translated to the node (NODEPORT_SNAT_IPV4) and a
 *                    port of NODEPORT_PORT_MIN_NAT..MAX_NAT; then routed
 *                    without the host stack (np_forward). A reply of such
 *                    a connection from a backend on another node (native
 *                    routing) is translated back here as well. A frontend
 *                    flagged LB4_SVC_SOURCE_RANGE drops the packets of
 *                    clients outside its loadBalancerSourceRanges
 *                    (DROP_NOT_IN_SRC_RANGE).
 *
 *   cil_to_netdev    tcx egress of the same devices: the replies of a
 *                    backend that is the node itself (a hostNetwork pod;
 *                    its connections go up the stack untranslated at the
 *                    source) are translated back to the frontend.
 *
 * Replies of local backends are translated back by cil_from_container
 * (bpf/lxc.c), replies through the tunnel by cil_from_overlay
 * (bpf/overlay.c), both with nodeport_rev_nat (include/nodeport.h).
 * Everything else passes untouched. See
 * Documentation/operations/kube-proxy-replacement-datapath.md.
 */
#include "include/bpf_api.h"
#include "include/net.h"
#include "include/abi.h"
#include "include/maps.h"
#include "include/metrics.h"
#include "include/lb.h"
#include "include/nodeport.h"
#include "include/maglev.h"
#include "include/dsr.h"

/* The node's IPv4 address on this device in network order, the source
 * address of SNAT (set by the loader per device; 0: the frontend's own
 * address, which is a node address for a NodePort). */
volatile const __u32 NODEPORT_SNAT_IPV4 = 0;
/* --bpf-lb-mode: NODEPORT_LB_MODE_SNAT (0, the default), _DSR or _HYBRID
 * (include/dsr.h). With SNAT the verifier removes every DSR branch. */
volatile const __u8 NODEPORT_LB_MODE = NODEPORT_LB_MODE_SNAT;

/* BPF_FIB_LKUP_RET_NOT_FWDED: the destination is local (or not unicast). */
#define NP_FIB_NOT_FWDED 4

/* np_affinity_backend returns the backend ID an outside client was sent to
 * for frontend fe, refreshing its entry, or 0 when there is none, it
 * expired or its backend is no backend of fe any more (as sock.c does for
 * a client network namespace; here a client is its address). */
static __always_inline __u32 np_affinity_backend(const struct lb4_key *fe, const struct lb4_service *svc,
						 const struct nodeport_affinity4_key *akey, __u64 now)
{
	struct nodeport_affinity4_value *val;
	__u32 id;

	val = map_lookup_elem(&cellium_nodeport_affinity4, akey);
	if (!val)
		return 0;
	id = val->backend_id;
	if (!lb4_affinity_valid(fe, svc, id, val->last_used, now)) {
		map_delete_elem(&cellium_nodeport_affinity4, akey);
		return 0;
	}
	val->last_used = now;
	return id;
}

/* np_no_service handles a packet to a frontend without backends: counted
 * and reported as DROP_NO_SERVICE, then rejected by the node's stack when
 * the frontend is a local address (no socket listens on a NodePort: TCP
 * gets a RST, UDP an ICMP port unreachable, so the client fails at once),
 * dropped otherwise (a LoadBalancer or external IP the stack would route
 * on). */
static __always_inline int np_no_service(struct __sk_buff *skb, const struct np_pkt *p)
{
	struct bpf_fib_lookup fib = {};

	count(skb->len, DROP_NO_SERVICE, METRIC_INGRESS);
	np_emit_drop(skb, p, DROP_NO_SERVICE, METRIC_INGRESS);
	fib.family = CELLIUM_AF_INET;
	fib.ifindex = skb->ingress_ifindex;
	fib.ipv4_src = p->saddr;
	fib.ipv4_dst = p->daddr;
	if (fib_lookup(skb, &fib, sizeof(fib), 0) == NP_FIB_NOT_FWDED)
		return TC_ACT_OK;
	return TC_ACT_SHOT;
}

/* np_is_host reports whether addr is an address of this node (the FIB
 * does not forward to it): a hostNetwork backend on the node. */
static __always_inline int np_is_host(struct __sk_buff *skb, const struct np_pkt *p, __be32 addr)
{
	struct bpf_fib_lookup fib = {};

	fib.family = CELLIUM_AF_INET;
	fib.ifindex = skb->ingress_ifindex;
	fib.ipv4_src = p->saddr;
	fib.ipv4_dst = addr;
	return fib_lookup(skb, &fib, sizeof(fib), 0) == NP_FIB_NOT_FWDED;
}

/* np_xlate translates a client's packet to the connection's backend
 * (and, with SNAT, its source to nat_addr:nat_port) and forwards it, or
 * for a backend on the node itself (host) passes it up the stack. */
static __always_inline int np_xlate(struct __sk_buff *skb, const struct np_pkt *p, __be32 backend, __be16 backend_port,
				    __be32 nat_addr, __be16 nat_port, const int host)
{
	int ret;

	ret = np_rewrite(skb, p, 0, p->daddr, backend, p->dport, backend_port);
	if (!ret)
		ret = np_rewrite(skb, p, 1, p->saddr, nat_addr, p->sport, nat_port);
	if (ret)
		return np_drop(skb, p, ret, METRIC_INGRESS);
	if (host) {
		count(skb->len, REASON_FORWARDED, METRIC_INGRESS);
		return TC_ACT_OK;
	}
	ret = np_forward(skb, p, nat_addr, backend);
	if (ret < 0)
		return np_drop(skb, p, -ret, METRIC_INGRESS);
	count(skb->len, REASON_FORWARDED, METRIC_INGRESS);
	return ret;
}

/* np_snat_port finds a free SNAT port for the reverse entry rkey (its
 * nat_port is set), among NODEPORT_SNAT_TRIES random ones: free means no
 * entry, or an expired one. It returns 0 when rev was inserted. */
static __always_inline int np_snat_port(struct nodeport_rev4_key *rkey, const struct nodeport_rev4_entry *rev, __u64 now)
{
	struct nodeport_rev4_entry *old;
	__u16 port;
	int i;

	for (i = 0; i < NODEPORT_SNAT_TRIES; i++) {
		port = NODEPORT_PORT_MIN_NAT +
		       (__u16)(get_prandom_u32() % (NODEPORT_PORT_MAX_NAT - NODEPORT_PORT_MIN_NAT + 1));
		rkey->nat_port = bpf_htons(port);
		old = map_lookup_elem(&cellium_nodeport_rev4, rkey);
		if (old) {
			if (old->expires > now)
				continue;
			map_delete_elem(&cellium_nodeport_rev4, rkey);
		}
		/* Another CPU may take the same port at the same time: only
		 * one insertion wins. */
		if (map_update_elem(&cellium_nodeport_rev4, rkey, rev, BPF_NOEXIST) == 0)
			return 0;
	}
	return -1;
}

SEC("tcx/ingress")
int cil_from_netdev(struct __sk_buff *skb)
{
	struct nodeport_affinity4_value aval = {};
	struct nodeport_affinity4_key akey = {};
	struct nodeport_rev4_entry rentry = {};
	struct nodeport_ct4_entry fentry = {};
	struct nodeport_rev4_key rkey = {};
	struct nodeport_ct4_key fkey = {};
	struct endpoint_key ekey = {};
	struct nodeport_rev4_entry *rev;
	struct nodeport_ct4_entry *fwd;
	const struct lb4_service *svc, *slot;
	const struct lb4_backend *be = 0;
	struct lb4_key key = {};
	struct np_pkt p = {};
	__be32 nat_addr;
	__u32 id = 0;
	__u64 now;
	int ret, snat, host;

	/* A reply from a backend on another node. */
	ret = nodeport_rev_nat_uplink(skb);
	if (ret != NP_NOT_NAT)
		return ret;
	if (np_parse(skb, &p))
		return TC_ACT_OK;
	now = ktime_get_ns();
	/* DSR: a connection another node sent to a local backend. */
	if (NODEPORT_LB_MODE != NODEPORT_LB_MODE_SNAT) {
		ret = dsr_backend_ingress(skb, &p, now);
		if (ret != NP_NOT_NAT)
			return ret;
	}

	key.address = p.daddr;
	key.dport = p.dport;
	key.proto = p.proto;
	key.scope = LB4_SCOPE_EXT;
	svc = map_lookup_elem(&cellium_lb4_services, &key);
	/* loadBalancerSourceRanges: every packet of a client outside them,
	 * also of a connection made before they changed, as Cilium. */
	if (svc && (svc->flags & LB4_SVC_NODEPORT) && !lb4_src_range_ok(&key, svc, p.saddr))
		return np_drop(skb, &p, DROP_NOT_IN_SRC_RANGE, METRIC_INGRESS);

	/* A later packet of a connection: the same backend, while it is
	 * one (a backend removed from cellium_lb4_backends or given to
	 * another address ends its connections). A new SYN on a closed
	 * entry chooses again. */
	fkey.client = p.saddr;
	fkey.frontend = p.daddr;
	fkey.client_port = p.sport;
	fkey.frontend_port = p.dport;
	fkey.proto = p.proto;
	fwd = map_lookup_elem(&cellium_nodeport_ct4, &fkey);
	if (fwd && fwd->expires > now &&
	    !((fwd->flags & NODEPORT_F_CLOSED) && (p.tcp_flags & (TCP_SYN | TCP_ACK)) == TCP_SYN)) {
		id = fwd->backend_id;
		be = map_lookup_elem(&cellium_lb4_backends, &id);
		if (be && be->address == fwd->backend && be->port == fwd->backend_port) {
			/* DSR: the replies never come here, there is no
			 * reverse entry. */
			if (NODEPORT_LB_MODE != NODEPORT_LB_MODE_SNAT && (fwd->flags & NODEPORT_F_DSR)) {
				np_track(&p, &fwd->flags, &fwd->expires, 0, 0, now);
				return dsr_xlate(skb, &p, fwd->backend, fwd->backend_port);
			}
			rkey.backend = fwd->backend;
			rkey.nat_addr = fwd->nat_addr;
			rkey.backend_port = fwd->backend_port;
			rkey.nat_port = fwd->nat_port;
			rkey.proto = p.proto;
			rev = map_lookup_elem(&cellium_nodeport_rev4, &rkey);
			/* Without its reverse entry (expired, or gone as stale)
			 * the connection's replies would not be translated: a
			 * SYN starts it again, anything else is the stack's. */
			if (rev && rev->expires > now) {
				np_track(&p, &fwd->flags, &fwd->expires, &rev->flags, &rev->expires, now);
				return np_xlate(skb, &p, fwd->backend, fwd->backend_port, fwd->nat_addr, fwd->nat_port,
						fwd->flags & NODEPORT_F_HOST);
			}
		}
		be = 0;
	}

	if (!svc || !(svc->flags & LB4_SVC_NODEPORT))
		return TC_ACT_OK;
	/* Only a SYN opens a TCP connection; any other segment without an
	 * entry goes to the stack, which resets it. */
	if (p.proto == IPPROTO_TCP && (p.tcp_flags & (TCP_SYN | TCP_ACK | TCP_RST | TCP_FIN)) != TCP_SYN)
		return TC_ACT_OK;
	/* A client claiming an address of this node's own pods is forged
	 * (their packets never arrive on an uplink): its connection would
	 * send the backend's replies, from the frontend, into that pod. */
	ekey.ip[0] = p.saddr;
	ekey.family = CELLIUM_AF_INET;
	if (map_lookup_elem(&cellium_lxc, &ekey))
		return np_drop(skb, &p, DROP_INVALID_SIP, METRIC_INGRESS);
	if (svc->count == 0)
		return np_no_service(skb, &p);

	if (svc->flags & LB4_SVC_AFFINITY) {
		akey.client = p.saddr;
		akey.frontend = p.daddr;
		akey.frontend_port = p.dport;
		akey.proto = p.proto;
		id = np_affinity_backend(&key, svc, &akey, now);
		if (id)
			be = map_lookup_elem(&cellium_lb4_backends, &id);
	}
	if (!be) {
		/* --bpf-lb-algorithm=maglev: the slot of the 5-tuple in the
		 * frontend's table (include/maglev.h), else at random. */
		id = lb4_maglev_backend(&p);
		if (!id) {
			key.slot = (__u16)(get_prandom_u32() % svc->count) + 1;
			slot = map_lookup_elem(&cellium_lb4_services, &key);
			if (!slot)
				return np_no_service(skb, &p);
			id = slot->backend_id;
		}
		be = map_lookup_elem(&cellium_lb4_backends, &id);
		if (!be)
			return np_no_service(skb, &p);
		if (svc->flags & LB4_SVC_AFFINITY) {
			aval.backend_id = id;
			aval.last_used = now;
			map_update_elem(&cellium_nodeport_affinity4, &akey, &aval, BPF_ANY);
		}
	}

	/* A backend on the node itself keeps the client's address: the
	 * stack would take the node's own as a martian source. */
	host = np_is_host(skb, &p, be->address);
	snat = !(svc->flags & LB4_SVC_LOCAL) && !host;
	/* DSR (include/dsr.h): the client's address is kept; a backend on
	 * this node replies through cil_from_container as with Local, one on
	 * another node directly to the client. */
	if (NODEPORT_LB_MODE != NODEPORT_LB_MODE_SNAT && snat && dsr_proto(NODEPORT_LB_MODE, p.proto)) {
		snat = 0;
		if (!dsr_local_endpoint(be->address)) {
			fentry.expires = now + np_lifetime(p.proto, 0);
			fentry.backend = be->address;
			fentry.backend_port = be->port;
			fentry.nat_addr = p.saddr;
			fentry.nat_port = p.sport;
			fentry.backend_id = id;
			fentry.flags = NODEPORT_F_DSR;
			if (map_update_elem(&cellium_nodeport_ct4, &fkey, &fentry, BPF_ANY) < 0)
				return np_drop(skb, &p, DROP_CT_CREATE_FAILED, METRIC_INGRESS);
			return dsr_xlate(skb, &p, be->address, be->port);
		}
	}
	nat_addr = snat ? (NODEPORT_SNAT_IPV4 ? NODEPORT_SNAT_IPV4 : p.daddr) : p.saddr;
	rentry.client = p.saddr;
	rentry.frontend = p.daddr;
	rentry.client_port = p.sport;
	rentry.frontend_port = p.dport;
	rentry.flags = snat ? NODEPORT_F_SNAT : 0;
	rentry.expires = now + np_lifetime(p.proto, 0);
	rkey.backend = be->address;
	rkey.nat_addr = nat_addr;
	rkey.backend_port = be->port;
	rkey.nat_port = p.sport;
	rkey.proto = p.proto;
	if (snat) {
		if (np_snat_port(&rkey, &rentry, now))
			return np_drop(skb, &p, DROP_NAT_NO_MAPPING, METRIC_INGRESS);
	} else if (map_update_elem(&cellium_nodeport_rev4, &rkey, &rentry, BPF_ANY) < 0) {
		return np_drop(skb, &p, DROP_CT_CREATE_FAILED, METRIC_INGRESS);
	}
	fentry.expires = rentry.expires;
	fentry.backend = be->address;
	fentry.backend_port = be->port;
	fentry.nat_addr = nat_addr;
	fentry.nat_port = rkey.nat_port;
	fentry.backend_id = id;
	fentry.flags = rentry.flags | (host ? NODEPORT_F_HOST : 0);
	if (map_update_elem(&cellium_nodeport_ct4, &fkey, &fentry, BPF_ANY) < 0) {
		map_delete_elem(&cellium_nodeport_rev4, &rkey);
		return np_drop(skb, &p, DROP_CT_CREATE_FAILED, METRIC_INGRESS);
	}
	return np_xlate(skb, &p, fentry.backend, fentry.backend_port, nat_addr, fentry.nat_port, host);
}

/* cil_to_netdev, at the tcx egress of the uplink devices, translates back
 * the node's own replies of NodePort connections to a hostNetwork backend
 * on the node (NODEPORT_F_HOST): (node:backend port -> client) becomes
 * (frontend -> client). Everything else passes untouched. */
SEC("tcx/egress")
int cil_to_netdev(struct __sk_buff *skb)
{
	int ret = nodeport_rev_nat_host(skb);

	if (ret != NP_NOT_NAT)
		return ret;
	return TC_ACT_OK;
}

char __license[] SEC("license") = "Dual BSD/GPL";
