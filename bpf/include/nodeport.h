/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * nodeport.h: the NAT state of the kube-proxy replacement for traffic from
 * outside the node (bpf/nodeport.c), and the reverse translation its
 * replies need wherever they arrive: bpf/nodeport.c on the uplink (a
 * remote backend's reply, native routing), bpf/lxc.c cil_from_container
 * (a local backend's reply) and bpf/overlay.c cil_from_overlay (a reply
 * through the tunnel). Keep in step with datapath/maps/nodeport.go; every
 * struct here gets a Go type through bpf2go -type. See
 * Documentation/operations/kube-proxy-replacement-datapath.md.
 */
#ifndef CELLIUM_NODEPORT_H
#define CELLIUM_NODEPORT_H

#include "bpf_api.h"
#include "net.h"
#include "abi.h"
#include "maps.h"
#include "metrics.h"

/* The source ports of SNAT (externalTrafficPolicy Cluster): Cilium's
 * NODEPORT_PORT_MIN_NAT..NODEPORT_PORT_MAX_NAT, the ports above the
 * NodePort range 30000-32767. */
#define NODEPORT_PORT_MIN_NAT 32768
#define NODEPORT_PORT_MAX_NAT 65535
/* How many random ports a new connection tries before it drops with
 * DROP_NAT_NO_MAPPING. */
#define NODEPORT_SNAT_TRIES 16

/* An entry's lifetime is refreshed at most this often per direction. */
#define NODEPORT_REFRESH_NS 1000000000ULL

/* cellium_nodeport_ct4: a connection from an outside client to a
 * frontend, keyed by its packets as they arrive on the uplink, and how
 * they are translated. */
struct nodeport_ct4_key {
	__be32 client;
	__be32 frontend;
	__be16 client_port;
	__be16 frontend_port;
	__u8 proto;
	__u8 pad[3];
};

/* nodeport_ct4_entry.flags and nodeport_rev4_entry.flags. */
#define NODEPORT_F_SNAT 0x1  /* the source is translated (externalTrafficPolicy Cluster) */
#define NODEPORT_F_FIN 0x2   /* a TCP FIN went this entry's way */
#define NODEPORT_F_CLOSED 0x4 /* RST, or a FIN each way: the entry lives CT_LIFETIME_CLOSE */
/* Reverse entry: the backend's SYN-ACK passed, its sequence number is in
 * synack_seq. A SYN-ACK of the same tuple with another sequence number is
 * a connection that did not come through the frontend (the client
 * reaching the pod directly from the same port after a NodePort connection
 * ended): the stale entry goes and the packet is left alone. */
#define NODEPORT_F_SYNACK 0x8
/* The backend is an address of this node (a hostNetwork pod): the
 * packets go up the node's stack, not forwarded, the client's address is
 * kept, and the host's replies are translated back on the uplink's egress
 * (cil_to_netdev). Forward entries only. */
#define NODEPORT_F_HOST 0x20
/* Direct server return (--bpf-lb-mode=dsr/hybrid, include/dsr.h): on the
 * frontend's node a forward entry whose backend is on another node (no
 * reverse entry there: the replies do not come back), on the backend's
 * node a reverse entry the DSR option made. */
#define NODEPORT_F_DSR 0x10
/* TCP: a segment without SYN went either way (Cilium's seen_non_syn):
 * until then both entries live CT_LIFETIME_SYN, so the SYNs of a flood
 * from spoofed clients, answered by nobody, free their entries and SNAT
 * ports within a minute instead of six hours. */
#define NODEPORT_F_ESTABLISHED 0x40

struct nodeport_ct4_entry {
	__u64 expires; /* ktime_get_ns */
	__be32 backend;
	__be32 nat_addr; /* the source the backend sees: the node, or the client (Local) */
	__be16 backend_port;
	__be16 nat_port;
	__u32 backend_id;
	__u8 flags;
	__u8 pad[7];
};

/* cellium_nodeport_rev4: the same connection keyed by its replies as
 * the backend sends them (backend -> node:NAT port, or backend -> client
 * with Local), and what to translate them back to. */
struct nodeport_rev4_key {
	__be32 backend;
	__be32 nat_addr;
	__be16 backend_port;
	__be16 nat_port;
	__u8 proto;
	__u8 pad[3];
};

struct nodeport_rev4_entry {
	__u64 expires;
	__be32 client;
	__be32 frontend;
	__be16 client_port;
	__be16 frontend_port;
	__u8 flags;
	__u8 pad[3];
	__u32 synack_seq; /* with NODEPORT_F_SYNACK */
	__u32 pad2;
};

/* cellium_nodeport_affinity4: the backend an outside client (by its
 * address) was sent to for a frontend with session affinity. */
struct nodeport_affinity4_key {
	__be32 client;
	__be32 frontend;
	__be16 frontend_port;
	__u8 proto;
	__u8 pad;
};

struct nodeport_affinity4_value {
	__u64 last_used;
	__u32 backend_id;
	__u32 pad;
};

/* Plain hashes, not LRU (as cellium_ct4): when one is full a new
 * connection drops (155, or 167 when no SNAT port could be reserved)
 * instead of evicting an established connection's entry, which a flood
 * of SYNs from spoofed clients would otherwise do to every idle
 * connection. The agent's conntrack GC (datapath/ctgc) deletes expired
 * entries. Preallocated: 65536 connections at a time per node (about
 * 6 MiB each) cost memory on every node, also with the replacement off. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct nodeport_ct4_key);
	__type(value, struct nodeport_ct4_entry);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cellium_nodeport_ct4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct nodeport_rev4_key);
	__type(value, struct nodeport_rev4_entry);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cellium_nodeport_rev4 SEC(".maps");

/* LRU: a client whose entry is evicted only gets a new backend. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct nodeport_affinity4_key);
	__type(value, struct nodeport_affinity4_value);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cellium_nodeport_affinity4 SEC(".maps");

/* nodeport_rev_nat's result when the packet is no reply of a NodePort
 * connection: the caller goes on with it. */
#define NP_NOT_NAT (-1)

/* The headers of a TCP or UDP packet, for the translation. */
struct np_pkt {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u32 l4_off;
	__u32 tcp_seq;
	__u8 proto;
	__u8 tcp_flags;
	__u8 ttl;
	__u8 pad;
};

/* np_parse reads an unfragmented IPv4 TCP or UDP packet's addresses and
 * ports (pulling them into the linear area once if needed). It returns 0,
 * or -1 for anything else: other protocols, fragments, short or malformed
 * headers are not translated (the caller leaves them alone). */
static __always_inline int np_parse(struct __sk_buff *skb, struct np_pkt *p)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u8 *ip = data + ETH_HLEN, *l4;
	__u32 ihl;

	if ((void *)(ip + 20) > data_end)
		return -1;
	if (bpf_ntohs(*(__be16 *)(data + 12)) != ETH_P_IP || (ip[0] >> 4) != 4)
		return -1;
	if (ip[9] != IPPROTO_TCP && ip[9] != IPPROTO_UDP)
		return -1;
	/* Any fragment: only the first has the ports (not translated). */
	if (bpf_ntohs(*(__be16 *)(ip + 6)) & 0x3fff)
		return -1;
	ihl = (ip[0] & 0x0f) * 4;
	if (ihl < 20 || ihl > 60)
		return -1;
	if ((void *)(ip + ihl + 20) > data_end) {
		skb_pull_data(skb, ETH_HLEN + ihl + 20 < skb->len ? ETH_HLEN + ihl + 20 : skb->len);
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
		ip = data + ETH_HLEN;
	}
	l4 = ip + ihl;
	if ((void *)(ip + 20) > data_end || (void *)(l4 + 8) > data_end)
		return -1;
	p->proto = ip[9];
	p->ttl = ip[8];
	p->saddr = *(__be32 *)(ip + 12);
	p->daddr = *(__be32 *)(ip + 16);
	p->sport = *(__be16 *)l4;
	p->dport = *(__be16 *)(l4 + 2);
	p->l4_off = ETH_HLEN + ihl;
	if (p->proto == IPPROTO_TCP) {
		if ((void *)(l4 + 20) > data_end)
			return -1;
		p->tcp_flags = l4[13];
		p->tcp_seq = *(__u32 *)(l4 + 4);
	}
	return 0;
}

/* np_csum_off is the offset of the L4 checksum in its header. */
static __always_inline __u32 np_csum_off(const struct np_pkt *p)
{
	return p->l4_off + (p->proto == IPPROTO_TCP ? 16 : 6);
}

/* np_rewrite replaces the source (src) or destination address and port
 * of the packet, with the IPv4 and L4 checksums. A UDP checksum of 0 (none)
 * stays 0. It returns 0 or DROP_WRITE_ERROR. */
static __always_inline int np_rewrite(struct __sk_buff *skb, const struct np_pkt *p, int src, __be32 old_addr,
				      __be32 new_addr, __be16 old_port, __be16 new_port)
{
	__u64 mangled = p->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
	__u32 csum = np_csum_off(p);

	if (old_addr != new_addr) {
		if (l4_csum_replace(skb, csum, old_addr, new_addr, BPF_F_PSEUDO_HDR | mangled | 4) < 0)
			return DROP_WRITE_ERROR;
		if (l3_csum_replace(skb, ETH_HLEN + 10, old_addr, new_addr, 4) < 0)
			return DROP_WRITE_ERROR;
		if (skb_store_bytes(skb, ETH_HLEN + (src ? 12 : 16), &new_addr, 4, 0) < 0)
			return DROP_WRITE_ERROR;
	}
	if (old_port != new_port) {
		if (l4_csum_replace(skb, csum, old_port, new_port, mangled | 2) < 0)
			return DROP_WRITE_ERROR;
		if (skb_store_bytes(skb, p->l4_off + (src ? 0 : 2), &new_port, 2, 0) < 0)
			return DROP_WRITE_ERROR;
	}
	return 0;
}

/* np_forward sends a translated packet on as the node's stack would
 * route it, without the stack (whose source validation would drop a
 * packet from the node's own address arriving on a device, and whose
 * conntrack knows nothing of the translation): TTL decremented, a FIB
 * lookup of the new destination, the MACs of the next hop, and a
 * redirect to the egress device (of the pod's host veth for a local
 * backend, where cil_to_container applies its ingress policy; of the
 * uplink or the tunnel device for a remote one; of the uplink back to
 * the client for a reply). An unresolved neighbour is resolved by
 * redirect_neigh. It returns the verdict, or -DROP_NO_FIB. */
static __always_inline int np_forward(struct __sk_buff *skb, const struct np_pkt *p, __be32 saddr,
				      __be32 daddr)
{
	struct bpf_fib_lookup fib = {};
	__u16 old_word, new_word;
	__u8 ttl = p->ttl;
	long ret;

	if (ttl > 1) {
		old_word = bpf_htons((__u16)ttl << 8 | p->proto);
		new_word = bpf_htons((__u16)(ttl - 1) << 8 | p->proto);
		ttl--;
		if (l3_csum_replace(skb, ETH_HLEN + 10, old_word, new_word, 2) < 0 ||
		    skb_store_bytes(skb, ETH_HLEN + 8, &ttl, 1, 0) < 0)
			return -DROP_WRITE_ERROR;
	}
	fib.family = CELLIUM_AF_INET;
	fib.l4_protocol = p->proto;
	fib.ifindex = skb->ingress_ifindex;
	fib.ipv4_src = saddr;
	fib.ipv4_dst = daddr;
	ret = fib_lookup(skb, &fib, sizeof(fib), 0);
	if (ret == BPF_FIB_LKUP_RET_SUCCESS) {
		if (skb_store_bytes(skb, 0, fib.dmac, 6, 0) < 0 || skb_store_bytes(skb, 6, fib.smac, 6, 0) < 0)
			return -DROP_WRITE_ERROR;
		return (int)redirect(fib.ifindex, 0);
	}
	if (ret == BPF_FIB_LKUP_RET_NO_NEIGH)
		return (int)redirect_neigh(fib.ifindex, 0, 0, 0);
	return -DROP_NO_FIB;
}

/* np_emit_drop sends a drop event of a packet the NodePort code drops
 * (no endpoint: endpoint_id 0, the device's ifindex). */
static __always_inline void np_emit_drop(struct __sk_buff *skb, const struct np_pkt *p, __u8 reason, __u8 dir)
{
	struct event *e = ringbuf_reserve(&cellium_events, sizeof(*e), 0);

	if (!e) {
		events_lost();
		return;
	}
	__builtin_memset(e, 0, sizeof(*e));
	e->type = EVENT_DROP;
	e->reason = reason;
	e->dir = dir;
	e->proto = p->proto;
	e->family = CELLIUM_AF_INET;
	e->src_identity = IDENTITY_WORLD;
	e->saddr[0] = p->saddr;
	e->daddr[0] = p->daddr;
	e->sport = p->sport;
	e->dport = p->dport;
	e->ifindex = skb->ifindex;
	e->orig_len = skb->len;
	e->version = EVENT_VERSION;
	e->tcp_flags = p->tcp_flags;
	e->ktime_ns = ktime_get_ns();
	ringbuf_submit(e, 0);
}

static __always_inline int np_drop(struct __sk_buff *skb, const struct np_pkt *p, __u8 reason, __u8 dir)
{
	count(skb->len, reason, dir);
	np_emit_drop(skb, p, reason, dir);
	return TC_ACT_SHOT;
}

/* np_lifetime is how long an entry lives after a packet with its flags. */
static __always_inline __u64 np_lifetime(__u8 proto, __u8 flags)
{
	if (flags & NODEPORT_F_CLOSED)
		return (__u64)CT_LIFETIME_CLOSE * 1000000000ULL;
	if (proto == IPPROTO_TCP && !(flags & NODEPORT_F_ESTABLISHED))
		return (__u64)CT_LIFETIME_SYN * 1000000000ULL;
	if (proto == IPPROTO_TCP)
		return (__u64)CT_LIFETIME_TCP * 1000000000ULL;
	return (__u64)CT_LIFETIME_NONTCP * 1000000000ULL;
}

/* np_track updates an entry's flags and lifetime for a packet of its own
 * direction (flags, expires: the entry's fields; other_flags,
 * other_expires: the other direction's entry's, NULL when it is gone),
 * and the other entry's lifetime with it. A RST, or a FIN when
 * the other way has sent one, closes both; the first segment without SYN
 * establishes both (CT_LIFETIME_TCP instead of CT_LIFETIME_SYN). */
static __always_inline void np_track(const struct np_pkt *p, __u8 *flags, __u64 *expires, __u8 *other_flags,
				     __u64 *other_expires, __u64 now)
{
	__u8 f = *flags;
	__u64 lt;

	if (p->proto == IPPROTO_TCP) {
		if (!(p->tcp_flags & TCP_SYN))
			f |= NODEPORT_F_ESTABLISHED;
		if (p->tcp_flags & TCP_FIN)
			f |= NODEPORT_F_FIN;
		if ((p->tcp_flags & TCP_RST) || ((f & NODEPORT_F_FIN) && other_flags && (*other_flags & NODEPORT_F_FIN)))
			f |= NODEPORT_F_CLOSED;
	}
	if (f != *flags)
		*flags = f;
	if ((f & NODEPORT_F_CLOSED) && other_flags && !(*other_flags & NODEPORT_F_CLOSED)) {
		*other_flags |= NODEPORT_F_CLOSED;
		*other_expires = now + np_lifetime(p->proto, NODEPORT_F_CLOSED);
	} else if ((f & NODEPORT_F_ESTABLISHED) && other_flags && !(*other_flags & NODEPORT_F_ESTABLISHED)) {
		*other_flags |= NODEPORT_F_ESTABLISHED;
		if (!(*other_flags & NODEPORT_F_CLOSED))
			*other_expires = now + np_lifetime(p->proto, NODEPORT_F_ESTABLISHED);
	}
	/* Refreshed at most once a second; a closed entry is never
	 * lengthened. */
	lt = np_lifetime(p->proto, f);
	if (f & NODEPORT_F_CLOSED) {
		if (*expires > now + lt)
			*expires = now + lt;
	} else {
		if (now + lt > *expires + NODEPORT_REFRESH_NS)
			*expires = now + lt;
		/* The connection lives while either way has packets (as
		 * Cilium's one conntrack entry): a one-way UDP flow keeps its
		 * reverse entry, whose SNAT port would otherwise be free after
		 * 60 s for another client of the same backend, whose replies
		 * would then also carry this client's datagrams' answers. */
		if (other_flags && !(*other_flags & NODEPORT_F_CLOSED) && now + lt > *other_expires + NODEPORT_REFRESH_NS)
			*other_expires = now + lt;
	}
}

/* np_from_next_hop tells whether a packet that arrived on an uplink from
 * saddr came from where this node would send a packet to saddr's node:
 * the same device and, when the neighbour is known, the next hop's MAC as
 * its Ethernet source (a reverse path check at layer 2; strict rp_filter
 * checks only the device, and on a shared wire every host is behind it).
 * saddr's node is its ipcache tunnel endpoint when it has one (in tunnel
 * mode the node's replies to this node's address take the wire, not the
 * tunnel), else saddr itself (native routing). */
static __always_inline int np_from_next_hop(struct __sk_buff *skb, const struct np_pkt *p)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ipcache_key ikey = {
		.prefixlen = IPCACHE_STATIC_PREFIX + 32,
		.family = CELLIUM_AF_INET,
		.ip = { p->saddr },
	};
	struct bpf_fib_lookup fib = {};
	const struct ipcache_value *v;
	__u8 *smac = data + 6;
	long ret;
	int i;

	v = map_lookup_elem(&cellium_ipcache, &ikey);
	fib.family = CELLIUM_AF_INET;
	fib.l4_protocol = p->proto;
	fib.ifindex = skb->ingress_ifindex;
	fib.ipv4_src = p->daddr;
	fib.ipv4_dst = v && v->tunnel_endpoint ? v->tunnel_endpoint : p->saddr;
	ret = fib_lookup(skb, &fib, sizeof(fib), 0);
	if (ret == BPF_FIB_LKUP_RET_NO_NEIGH)
		return fib.ifindex == skb->ingress_ifindex;
	if (ret != BPF_FIB_LKUP_RET_SUCCESS || fib.ifindex != skb->ingress_ifindex)
		return 0;
	if ((void *)(smac + 6) > data_end)
		return 0;
	for (i = 0; i < 6; i++)
		if (smac[i] != fib.dmac[i])
			return 0;
	return 1;
}

/* __nodeport_rev_nat translates a reply of a NodePort connection back,
 * from (backend -> node:NAT port) or (backend -> client, Local or a
 * backend on the node itself) to (frontend -> client), and sends it to the
 * client (np_forward), or with via_stack lets it go on (the reply of the
 * node itself, already routed by its stack, on the uplink's egress). It
 * returns NP_NOT_NAT for any other packet, else the verdict. dir is the
 * metrics direction of the hook; count_fwd counts a forwarded packet (the
 * caller has not already); check_hop: the packet arrived on an uplink and
 * must come from the backend's next hop (np_from_next_hop). */
static __always_inline int __nodeport_rev_nat(struct __sk_buff *skb, __u8 dir, const int count_fwd,
					      const int check_hop, const int via_stack)
{
	struct nodeport_rev4_key key = {};
	struct nodeport_ct4_key fkey = {};
	struct nodeport_rev4_entry *rev;
	struct nodeport_ct4_entry *fwd;
	struct np_pkt p = {};
	__u64 now;
	int ret;

	if (np_parse(skb, &p))
		return NP_NOT_NAT;
	key.backend = p.saddr;
	key.nat_addr = p.daddr;
	key.backend_port = p.sport;
	key.nat_port = p.dport;
	key.proto = p.proto;
	rev = map_lookup_elem(&cellium_nodeport_rev4, &key);
	if (!rev)
		return NP_NOT_NAT;
	now = ktime_get_ns();
	if (rev->expires <= now)
		return NP_NOT_NAT;
	if (check_hop && !np_from_next_hop(skb, &p))
		return np_drop(skb, &p, DROP_INVALID_SIP, dir);
	if (p.proto == IPPROTO_TCP && (p.tcp_flags & TCP_SYN)) {
		if ((rev->flags & NODEPORT_F_SYNACK) && rev->synack_seq != p.tcp_seq) {
			map_delete_elem(&cellium_nodeport_rev4, &key);
			return NP_NOT_NAT;
		}
		rev->synack_seq = p.tcp_seq;
		rev->flags |= NODEPORT_F_SYNACK;
	}
	fkey.client = rev->client;
	fkey.frontend = rev->frontend;
	fkey.client_port = rev->client_port;
	fkey.frontend_port = rev->frontend_port;
	fkey.proto = p.proto;
	fwd = map_lookup_elem(&cellium_nodeport_ct4, &fkey);
	np_track(&p, &rev->flags, &rev->expires, fwd ? &fwd->flags : 0, fwd ? &fwd->expires : 0, now);

	ret = np_rewrite(skb, &p, 1, p.saddr, rev->frontend, p.sport, rev->frontend_port);
	if (!ret)
		ret = np_rewrite(skb, &p, 0, p.daddr, rev->client, p.dport, rev->client_port);
	if (ret)
		return np_drop(skb, &p, ret, dir);
	if (via_stack) {
		/* The node's stack routed the reply already. */
		if (count_fwd)
			count(skb->len, REASON_FORWARDED, dir);
		return TC_ACT_OK;
	}
	ret = np_forward(skb, &p, rev->frontend, rev->client);
	if (ret < 0)
		return np_drop(skb, &p, -ret, dir);
	if (count_fwd)
		count(skb->len, REASON_FORWARDED, dir);
	return ret;
}

/* nodeport_rev_nat is __nodeport_rev_nat of a packet from a local
 * backend (bpf/lxc.c, after its source validation) or from the tunnel
 * (bpf/overlay.c, after its sender check). */
static __always_inline int nodeport_rev_nat(struct __sk_buff *skb, __u8 dir, const int count_fwd)
{
	return __nodeport_rev_nat(skb, dir, count_fwd, 0, 0);
}

/* nodeport_rev_nat_uplink is __nodeport_rev_nat of a packet arriving on
 * an uplink (a remote backend's reply, native routing), which must come
 * from the backend's next hop: anyone else on the wire forging a
 * backend's reply to a client's NAT port (to inject data into its
 * connection, or close it with a RST) is dropped with DROP_INVALID_SIP
 * before the entry is touched. */
static __always_inline int nodeport_rev_nat_uplink(struct __sk_buff *skb)
{
	return __nodeport_rev_nat(skb, METRIC_INGRESS, 1, 1, 0);
}

/* nodeport_rev_nat_host is __nodeport_rev_nat of the node's own reply
 * (a hostNetwork backend on the node) at the uplink's egress: routed by
 * the node's stack already, it only needs its source translated back. */
static __always_inline int nodeport_rev_nat_host(struct __sk_buff *skb)
{
	return __nodeport_rev_nat(skb, METRIC_EGRESS, 1, 0, 1);
}

#endif /* CELLIUM_NODEPORT_H */
