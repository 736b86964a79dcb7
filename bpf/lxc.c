// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * lxc.c: cellium's programs for the host side of a pod's veth.
 *
 *   cil_from_container  tcx ingress of the host veth: packets the pod sends,
 *                       checked against the endpoint's egress policy.
 *   cil_to_container    tcx egress of the host veth: packets to the pod,
 *                       checked against the endpoint's ingress policy.
 *
 * Both parse Ethernet and IPv4 with TCP, UDP or ICMP, find the remote
 * identity in the ipcache, and decide with the endpoint's policy map and
 * the conntrack table; see bpf/README.md for the model.
 */
#include "include/bpf_api.h"
#include "include/net.h"
#include "include/abi.h"
#include "include/maps.h"
#include "include/metrics.h"
#include "include/nodeport.h"

/* Per-endpoint constants, rewritten at load time. */
volatile const __u16 ENDPOINT_ID = 0;
volatile const __u32 SECURITY_IDENTITY = 0;
volatile const __u32 ENDPOINT_IFINDEX = 0;
volatile const __u64 ENDPOINT_MAC = 0;
/* The endpoint's IPv4 address in network order: the only source address
 * its packets may carry (0: none, so every IPv4 packet it sends drops). */
volatile const __u32 ENDPOINT_IPV4 = 0;
volatile const __u8 POLICY_AUDIT_MODE = 0;
/* The kube-proxy replacement is on (--kube-proxy-replacement): replies of
 * connections bpf/nodeport.c translated to this pod are translated back
 * (nodeport_rev_nat); off, the lookup is not even made. */
volatile const __u8 NODEPORT_ENABLED = 0;
volatile const __u8 TRACE_ENABLED = 0;
/* --monitor-aggregation (MONITOR_AGG_*, abi.h), --monitor-aggregation-interval
 * in seconds, --monitor-aggregation-flags as a mask of TCP flags: which
 * passed packets are traced when TRACE_ENABLED (see trace()). */
volatile const __u8 MONITOR_AGGREGATION = 0;
volatile const __u32 MONITOR_REPORT_INTERVAL = 5;
volatile const __u8 MONITOR_REPORT_FLAGS = 0x07; /* FIN, SYN, RST */

/* How much of the packet must be in the linear area: Ethernet, the
 * longest IPv4 header, and then either a TCP header without options or an
 * ICMP error's 8 bytes with the longest inner IPv4 header and 8 bytes of
 * its L4 header. */
#define PARSE_LEN (ETH_HLEN + 60 + 8 + 60 + 8)

/* parse results besides drop reasons. */
#define PARSE_IPV4 0
#define PARSE_ARP 1
#define PARSE_SHORT 2 /* not enough linear data: pull and parse again */

/* pkt.frag. */
#define FRAG_NONE 0
#define FRAG_FIRST 1 /* the first fragment of a datagram: it has the ports */
#define FRAG_LATER 2 /* a later fragment: ports from the first */

/* An ICMP error's quoted packet, the one the error is about. */
struct inner {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 valid;
	__u16 pad;
};

struct pkt {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;        /* conntrack ports: the ICMP echo id for echoes */
	__be16 dport;
	__be16 policy_dport; /* the port the policy sees: the ICMP type for ICMP */
	__be16 ip_id;
	__u8 proto;
	__u8 tcp_flags;
	__u8 family;
	__u8 short_reason; /* drop reason when still short after a pull */
	__u8 icmp_type;
	__u8 frag;         /* FRAG_* */
	__u8 icmp_code;
	__u8 ev_flags;     /* EVENT_F_REPLY* of the events */
	__u32 src_identity;
	__u32 dst_identity;
	struct inner inner;
	/* The destination before the socket load balancer translated it,
	 * 0 for none (sock_orig_dst). */
	__be32 orig_daddr;
	__be16 orig_dport;
	__u8 monitor;      /* conntrack has news of this packet: trace it */
	__u8 pad;
};

static __always_inline int icmp_is_error(__u8 type)
{
	return type == ICMP_DEST_UNREACH || type == ICMP_TIME_EXCEEDED || type == ICMP_PARAMETERPROB;
}

/* parse_inner reads the packet an ICMP error quotes, at q (the error's
 * header plus 8): its IPv4 header and the first 8 bytes of its L4 header,
 * the ports (the echo id for an echo), in the orientation of that packet.
 * The quote must lie inside the error's IPv4 datagram (end). */
static __always_inline int parse_inner(struct pkt *p, __u8 *q, void *end, void *data_end)
{
	__u8 *l4;
	__u32 ihl;

	if ((void *)(q + 20) > end)
		return DROP_CT_INVALID_HDR;
	if ((void *)(q + 20) > data_end)
		return PARSE_SHORT;
	if ((q[0] >> 4) != 4)
		return DROP_INVALID;
	ihl = (q[0] & 0x0f) * 4;
	if (ihl < 20)
		return DROP_INVALID;
	l4 = q + ihl;
	if ((void *)(l4 + 8) > end)
		return DROP_CT_INVALID_HDR;
	if ((void *)(l4 + 8) > data_end)
		return PARSE_SHORT;
	p->inner.saddr = *(__be32 *)(q + 12);
	p->inner.daddr = *(__be32 *)(q + 16);
	p->inner.proto = q[9];
	switch (p->inner.proto) {
	case IPPROTO_TCP:
	case IPPROTO_UDP:
	case IPPROTO_SCTP:
		p->inner.sport = *(__be16 *)l4;
		p->inner.dport = *(__be16 *)(l4 + 2);
		break;
	case IPPROTO_ICMP:
		if (l4[0] == ICMP_ECHO)
			p->inner.sport = *(__be16 *)(l4 + 4);
		else if (l4[0] == ICMP_ECHOREPLY)
			p->inner.dport = *(__be16 *)(l4 + 4);
		else
			return PARSE_IPV4; /* an error about an error: not related */
		break;
	default:
		break;
	}
	p->inner.valid = 1;
	return PARSE_IPV4;
}

/* parse reads Ethernet, IPv4 and the L4 header into p. Every header must
 * lie inside the IPv4 datagram as tot_len gives it, and the datagram
 * inside the packet; trailing bytes after it (padding) are not read. */
static __always_inline int parse(struct __sk_buff *skb, struct pkt *p)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u8 *ip, *l4;
	void *end;
	__u16 frag, tot_len;
	__u32 ihl;

	p->short_reason = DROP_INVALID;
	if (data + ETH_HLEN > data_end)
		return PARSE_SHORT;
	switch (bpf_ntohs(*(__be16 *)(data + 12))) {
	case ETH_P_IP:
		break;
	case ETH_P_ARP:
		return PARSE_ARP;
	default:
		/* IPv6 too: the endpoints are IPv4 only. */
		return DROP_UNKNOWN_L3;
	}

	ip = data + ETH_HLEN;
	if ((void *)(ip + 20) > data_end)
		return PARSE_SHORT;
	if ((ip[0] >> 4) != 4)
		return DROP_INVALID;
	ihl = (ip[0] & 0x0f) * 4;
	if (ihl < 20)
		return DROP_INVALID;
	tot_len = bpf_ntohs(*(__be16 *)(ip + 2));
	if (tot_len < ihl || ETH_HLEN + (__u32)tot_len > skb->len)
		return DROP_INVALID;
	if ((void *)(ip + ihl) > data_end)
		return PARSE_SHORT;
	end = ip + tot_len;
	p->family = CELLIUM_AF_INET;
	p->proto = ip[9];
	p->saddr = *(__be32 *)(ip + 12);
	p->daddr = *(__be32 *)(ip + 16);
	p->ip_id = *(__be16 *)(ip + 4);

	/* A fragment other than the first has no L4 header: its ports are
	 * its first fragment's (handle looks them up). */
	frag = bpf_ntohs(*(__be16 *)(ip + 6));
	if (frag & IP_OFFSET) {
		p->frag = FRAG_LATER;
		return PARSE_IPV4;
	}
	if (frag & IP_MF)
		p->frag = FRAG_FIRST;

	l4 = ip + ihl;
	p->short_reason = DROP_CT_INVALID_HDR;
	switch (p->proto) {
	case IPPROTO_TCP:
		if ((void *)(l4 + 20) > end)
			return DROP_CT_INVALID_HDR;
		if ((void *)(l4 + 20) > data_end)
			return PARSE_SHORT;
		if ((l4[12] >> 4) < 5 || (void *)(l4 + (l4[12] >> 4) * 4) > end)
			return DROP_CT_INVALID_HDR;
		p->sport = *(__be16 *)l4;
		p->dport = *(__be16 *)(l4 + 2);
		p->policy_dport = p->dport;
		p->tcp_flags = l4[13];
		break;
	case IPPROTO_UDP:
	case IPPROTO_SCTP:
		/* UDP's header (8 bytes) and SCTP's common header (12) both
		 * begin with the two ports. */
		if ((void *)(l4 + (p->proto == IPPROTO_SCTP ? 12 : 8)) > end)
			return DROP_CT_INVALID_HDR;
		if ((void *)(l4 + 8) > data_end)
			return PARSE_SHORT;
		p->sport = *(__be16 *)l4;
		p->dport = *(__be16 *)(l4 + 2);
		p->policy_dport = p->dport;
		break;
	case IPPROTO_ICMP:
		if ((void *)(l4 + 8) > end)
			return DROP_CT_INVALID_HDR;
		if ((void *)(l4 + 8) > data_end)
			return PARSE_SHORT;
		/* The policy sees the ICMP type where other protocols have
		 * the destination port (as the policy engine stores it). */
		p->icmp_type = l4[0];
		p->icmp_code = l4[1];
		p->policy_dport = bpf_htons((__u16)l4[0]);
		/* Echo request and reply carry the same id: as source port of
		 * the request and destination port of the reply, so a reply's
		 * reversed tuple is its request's. */
		if (l4[0] == ICMP_ECHO)
			p->sport = *(__be16 *)(l4 + 4);
		else if (l4[0] == ICMP_ECHOREPLY)
			p->dport = *(__be16 *)(l4 + 4);
		else if (icmp_is_error(l4[0]) && p->frag == FRAG_NONE)
			return parse_inner(p, l4 + 8, end, data_end);
		break;
	}
	return PARSE_IPV4;
}

static __always_inline int parse_pkt(struct __sk_buff *skb, struct pkt *p)
{
	int ret = parse(skb, p);

	if (ret != PARSE_SHORT)
		return ret;
	skb_pull_data(skb, skb->len < PARSE_LEN ? skb->len : PARSE_LEN);
	__builtin_memset(p, 0, sizeof(*p));
	ret = parse(skb, p);
	if (ret == PARSE_SHORT)
		return p->short_reason;
	return ret;
}

/* ipcache_identity4 returns addr's identity (world when no prefix holds
 * it) and sets *cidr_id to the identity of the policy CIDR that also holds
 * it (0: none) and *flags to its entry's IPCACHE_F_* (0 for a miss). */
static __always_inline __u32 ipcache_identity4(__be32 addr, __u32 *cidr_id, __u8 *flags)
{
	struct ipcache_key key = {
		.prefixlen = IPCACHE_STATIC_PREFIX + 32,
		.family = CELLIUM_AF_INET,
		.ip = { addr },
	};
	struct ipcache_value *v = map_lookup_elem(&cellium_ipcache, &key);
	__u32 low;

	*cidr_id = 0;
	*flags = 0;
	if (!v)
		return IDENTITY_WORLD;
	*flags = v->flags;
	low = (__u32)v->cidr_id[0] | ((__u32)v->cidr_id[1] << 8) | ((__u32)v->cidr_id[2] << 16);
	if (low)
		*cidr_id = IDENTITY_SCOPE_LOCAL | low;
	return v->sec_identity;
}

/* policy_verdict decides like statedb/policy DirectionPolicy.Decide: the
 * longest entry for the exact identity, a deny there is final; then the
 * longest entry for identity 0; a deny beats an allow; nothing matching
 * drops. It returns 0 (allowed), DROP_POLICY or DROP_POLICY_DENY, and sets
 * *allow_all when the allow came from an identity-0, any-protocol entry
 * alone (what a direction without enforcement holds). */
static __always_inline int policy_verdict(__u32 remote_id, __u8 egress, __u8 proto,
					  __be16 dport, int *allow_all)
{
	struct policy_key key = {
		.prefixlen = POLICY_FULL_PREFIX,
		.sec_label = remote_id,
		.egress = egress,
		.protocol = proto,
		.dport = dport,
	};
	struct policy_entry *l3, *l4;

	*allow_all = 0;
	l3 = map_lookup_elem(&cellium_policy, &key);
	if (l3 && l3->deny)
		return DROP_POLICY_DENY;
	key.sec_label = 0;
	l4 = map_lookup_elem(&cellium_policy, &key);
	if (!l4)
		return l3 ? 0 : DROP_POLICY;
	if (l4->deny)
		return DROP_POLICY_DENY;
	if (!l3 && l4->lpm_prefix_length == 0)
		*allow_all = 1;
	return 0;
}

/* cidr_verdict combines ret, the verdict on the remote's identity, with
 * the verdict on the identity of the policy CIDR that holds its address
 * (a pod's address an ipBlock names): a deny on either is final, an allow
 * on either allows. */
static __always_inline int cidr_verdict(int ret, __u32 cidr_id, __u8 dir, __u8 proto,
					__be16 dport, int *allow_all)
{
	int cidr_all, cidr_ret = policy_verdict(cidr_id, dir, proto, dport, &cidr_all);

	if (cidr_ret == DROP_POLICY_DENY)
		return DROP_POLICY_DENY;
	if (ret == 0)
		return 0;
	if (cidr_ret == 0)
		*allow_all = cidr_all;
	return cidr_ret;
}

static __always_inline void emit(struct __sk_buff *skb, const struct pkt *p, __u8 type,
				 __u8 reason, __u8 dir, __u8 verdict)
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
	e->verdict = verdict;
	e->endpoint_id = ENDPOINT_ID;
	e->proto = p->proto;
	e->family = p->family;
	e->src_identity = p->src_identity;
	e->dst_identity = p->dst_identity;
	e->saddr[0] = p->saddr;
	e->daddr[0] = p->daddr;
	e->sport = p->sport;
	e->dport = p->dport;
	e->ifindex = ENDPOINT_IFINDEX;
	e->orig_len = skb->len;
	e->version = EVENT_VERSION;
	e->tcp_flags = p->tcp_flags;
	if (p->proto == IPPROTO_ICMP) {
		e->icmp_type = p->icmp_type;
		e->icmp_code = p->icmp_code;
	}
	e->flags = p->ev_flags;
	if (p->orig_daddr) {
		e->flags |= EVENT_F_ORIG_DST;
		e->orig_daddr = p->orig_daddr;
		e->orig_dport = p->orig_dport;
	}
	e->ktime_ns = ktime_get_ns();
	ringbuf_submit(e, 0);
}

/* trace sends a trace event of a passed packet at observation point obs,
 * as --monitor-aggregation allows: at LOWEST and above not at a point
 * where the packet arrives (from-endpoint), at MEDIUM and above only when
 * conntrack has news of the packet (p->monitor, ct_report). */
static __always_inline void trace(struct __sk_buff *skb, const struct pkt *p, __u8 dir, __u8 obs)
{
	if (!TRACE_ENABLED)
		return;
	if (MONITOR_AGGREGATION >= MONITOR_AGG_LOWEST && obs == TRACE_FROM_LXC)
		return;
	if (MONITOR_AGGREGATION >= MONITOR_AGG_MEDIUM && !p->monitor)
		return;
	emit(skb, p, EVENT_TRACE, obs, dir, 0);
}

static __always_inline int drop(struct __sk_buff *skb, const struct pkt *p, __u8 reason, __u8 dir)
{
	count(skb->len, reason, dir);
	emit(skb, p, EVENT_DROP, reason, dir, 0);
	return TC_ACT_SHOT;
}

static __always_inline int pass(struct __sk_buff *skb, const struct pkt *p, __u8 dir, __u8 obs)
{
	count(skb->len, REASON_FORWARDED, dir);
	trace(skb, p, dir, obs);
	return TC_ACT_OK;
}

/* ct_report decides whether a packet of a live entry is news for the
 * monitor at MEDIUM aggregation and above, and records that it was: a
 * report TCP flag (MONITOR_REPORT_FLAGS) its direction has not traced
 * yet, or MONITOR_REPORT_INTERVAL seconds since its direction's last
 * trace (an entry's first reply is always news: its last_rx_report is 0).
 * Two CPUs racing on one entry may both report: a few duplicate traces,
 * never a lost first one. */
static __always_inline __u8 ct_report(struct ct_entry *ct, const struct pkt *p, __u64 now, int reply)
{
	__u32 now_s = (__u32)(now / NSEC_PER_SEC);
	__u8 flags = p->tcp_flags & MONITOR_REPORT_FLAGS;

	if (!TRACE_ENABLED || MONITOR_AGGREGATION < MONITOR_AGG_MEDIUM)
		return 1;
	if (reply) {
		if (!(flags & ~ct->rx_flags_seen) && now_s - ct->last_rx_report < MONITOR_REPORT_INTERVAL)
			return 0;
		ct->rx_flags_seen |= flags;
		ct->last_rx_report = now_s;
		return 1;
	}
	if (!(flags & ~ct->tx_flags_seen) && now_s - ct->last_tx_report < MONITOR_REPORT_INTERVAL)
		return 0;
	ct->tx_flags_seen |= flags;
	ct->last_tx_report = now_s;
	return 1;
}

/* sock_orig_dst sets p->orig_daddr/orig_dport to the Service frontend
 * (ClusterIP:port) the packet's socket connected or sent to, when the
 * socket load balancer translated it to this packet's destination: its
 * cellium_lb4_reverse_sk entry (socket cookie, backend -> frontend), read
 * through slot 0 of cellium_lb4_reverse_sk_ref while the socket load
 * balancer is on. A packet without a socket (the host stack orphans what
 * it forwards) or of another protocol has none. */
static __always_inline void sock_orig_dst(struct __sk_buff *skb, struct pkt *p)
{
	struct sock_xlate_key key = {};
	struct sock_xlate_value *v;
	__u32 zero = 0;
	void *inner;

	if (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP)
		return;
	inner = map_lookup_elem(&cellium_lb4_reverse_sk_ref, &zero);
	if (!inner)
		return;
	key.cookie = get_socket_cookie(skb);
	if (!key.cookie)
		return;
	key.address = p->daddr;
	key.port = p->dport;
	v = map_lookup_elem(inner, &key);
	if (!v || v->proto != p->proto)
		return;
	p->orig_daddr = v->address;
	p->orig_dport = v->port;
}

static __always_inline __u64 ct_lifetime(__u8 proto, __u16 flags)
{
	if (proto != IPPROTO_TCP)
		return CT_LIFETIME_NONTCP * NSEC_PER_SEC;
	if (flags & CT_F_CLOSING)
		return CT_LIFETIME_CLOSE * NSEC_PER_SEC;
	if (flags & CT_F_REPLY_SEEN)
		return CT_LIFETIME_TCP * NSEC_PER_SEC;
	return CT_LIFETIME_SYN * NSEC_PER_SEC;
}

/* ct_update records a packet of a live entry and moves its deadline. A
 * packet in the connection's own direction (not reply) also records in
 * CT_F_VIA_STACK whether it came through the host stack (via_stack). A
 * RST closes the connection, and so does a FIN in each direction. */
static __always_inline void ct_update(struct ct_entry *ct, const struct pkt *p, __u64 now, int reply,
				      __u16 via_stack)
{
	__u16 flags = ct->flags;

	if (reply) {
		ct->rx_packets += 1;
		flags |= CT_F_REPLY_SEEN;
		if (p->tcp_flags & TCP_FIN)
			flags |= CT_F_RX_FIN;
	} else {
		ct->tx_packets += 1;
		flags = (flags & ~CT_F_VIA_STACK) | via_stack;
		if (p->tcp_flags & TCP_FIN)
			flags |= CT_F_TX_FIN;
	}
	if ((p->tcp_flags & TCP_RST) || (flags & (CT_F_TX_FIN | CT_F_RX_FIN)) == (CT_F_TX_FIN | CT_F_RX_FIN))
		flags |= CT_F_CLOSING;
	if (flags != ct->flags)
		ct->flags = flags;
	ct->expires = now + ct_lifetime(p->proto, flags);
}

/* remote_identity4 is the identity of the remote address addr: local_src
 * when not 0 (the same-node redirect hands the source endpoint's own
 * identity over), else the ipcache's. *cidr_id is the identity of the
 * policy CIDR holding addr (0: none) and *flags its ipcache entry's
 * IPCACHE_F_*; with local_src they are looked up only when want_cidr is
 * set. */
static __always_inline __u32 remote_identity4(__be32 addr, __u32 local_src, int want_cidr, __u32 *cidr_id,
					      __u8 *flags)
{
	*cidr_id = 0;
	*flags = 0;
	if (!local_src)
		return ipcache_identity4(addr, cidr_id, flags);
	if (want_cidr)
		ipcache_identity4(addr, cidr_id, flags);
	return local_src;
}

/* decide is the verdict of direction pol_dir's policy on remote_id and
 * the policy CIDR identity cidr_id holding its address (0: none). */
static __always_inline int decide(__u8 pol_dir, __u32 remote_id, __u32 cidr_id, __u8 proto, __be16 dport,
				  int *allow_all)
{
	int ret = policy_verdict(remote_id, pol_dir, proto, dport, allow_all);

	if (cidr_id && cidr_id != remote_id && ret != DROP_POLICY_DENY)
		ret = cidr_verdict(ret, cidr_id, pol_dir, proto, dport, allow_all);
	return ret;
}

/* validate_source checks a packet the pod sent: its source MAC and IPv4
 * address, or an ARP packet's sender addresses, must be the endpoint's.
 * Anything else is a forged packet and drops before conntrack sees it. */
static __always_inline int validate_source(struct __sk_buff *skb, const struct pkt *p, int parsed)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u64 mac = 0;
	__u8 *arp;

	if (data + ETH_HLEN > data_end)
		return DROP_INVALID;
	__builtin_memcpy(&mac, data + 6, 6);
	if (ENDPOINT_MAC && mac != ENDPOINT_MAC)
		return DROP_INVALID_SMAC;
	if (parsed == PARSE_IPV4)
		return p->saddr == ENDPOINT_IPV4 && ENDPOINT_IPV4 ? 0 : DROP_INVALID_SIP;
	/* ARP for IPv4 over Ethernet: hardware type 1, protocol 0x0800,
	 * lengths 6 and 4; sender MAC at 8, sender IP at 14. */
	arp = data + ETH_HLEN;
	if ((void *)(arp + 28) > data_end)
		return DROP_INVALID;
	if (arp[0] != 0 || arp[1] != 1 || arp[2] != 0x08 || arp[3] != 0 || arp[4] != 6 || arp[5] != 4)
		return DROP_INVALID;
	mac = 0;
	__builtin_memcpy(&mac, arp + 8, 6);
	if (ENDPOINT_MAC && mac != ENDPOINT_MAC)
		return DROP_INVALID_SMAC;
	if (!ENDPOINT_IPV4 || *(__be32 *)(arp + 14) != ENDPOINT_IPV4)
		return DROP_INVALID_SIP;
	return 0;
}

/* frag_ports gives a fragment the ports of its datagram: a first fragment
 * records them, a later one takes them (175 when its first fragment was
 * never seen: its policy cannot be known). */
static __always_inline int frag_ports(struct pkt *p)
{
	struct ipv4_frag_id id = {
		.daddr = p->daddr,
		.saddr = p->saddr,
		.id = p->ip_id,
		.proto = p->proto,
	};
	struct ipv4_frag_l4ports *ports;

	if (p->frag == FRAG_FIRST) {
		struct ipv4_frag_l4ports v = {
			.sport = p->sport,
			.dport = p->dport,
			.policy_dport = p->policy_dport,
		};

		map_update_elem(&cellium_ipv4_frag_datagrams, &id, &v, BPF_ANY);
		return 0;
	}
	ports = map_lookup_elem(&cellium_ipv4_frag_datagrams, &id);
	if (!ports)
		return DROP_FRAG_NOT_FOUND;
	p->sport = ports->sport;
	p->dport = ports->dport;
	p->policy_dport = ports->policy_dport;
	/* An ICMP datagram's type is in its policy port. */
	if (p->proto == IPPROTO_ICMP)
		p->icmp_type = (__u8)bpf_ntohs(ports->policy_dport);
	return 0;
}

/* ct_live returns the entry of key if it has not expired by now. */
static __always_inline struct ct_entry *ct_live(const struct ct4_key *key, __u64 now)
{
	struct ct_entry *ct = map_lookup_elem(&cellium_ct4, key);

	return ct && ct->expires > now ? ct : 0;
}

/* ct_related reports whether an ICMP error is about a live connection of
 * this endpoint: the packet it quotes is one the endpoint sent in it (the
 * error comes in; the quote's source is the endpoint) or one the endpoint
 * received in it (the error goes out to that packet's sender). */
static __always_inline int ct_related(const struct pkt *p, const int egress, __u64 now)
{
	struct ct4_key key = {
		.proto = p->inner.proto,
		.endpoint = ENDPOINT_ID,
	};

	if (!p->inner.valid)
		return 0;
	if (egress ? (p->inner.daddr != p->saddr || p->inner.saddr != p->daddr) : p->inner.saddr != p->daddr)
		return 0;
	/* The quoted packet as the connection's own direction of the other
	 * hook's entry... */
	key.saddr = p->inner.saddr;
	key.daddr = p->inner.daddr;
	key.sport = p->inner.sport;
	key.dport = p->inner.dport;
	key.dir = egress ? CT_DIR_INGRESS : CT_DIR_EGRESS;
	if (ct_live(&key, now))
		return 1;
	/* ... or as a reply of this hook's entry. */
	key.saddr = p->inner.daddr;
	key.daddr = p->inner.saddr;
	key.sport = p->inner.dport;
	key.dport = p->inner.sport;
	key.dir = egress ? CT_DIR_EGRESS : CT_DIR_INGRESS;
	return ct_live(&key, now) != 0;
}

/* opens_connection reports whether a packet that matched no entry may
 * make one: any UDP or other datagram, an ICMP echo request, a TCP SYN
 * without ACK, RST or FIN. Other TCP packets, ICMP replies and errors
 * pass if the policy allows them but open nothing, so a forged RST or ACK
 * can never make an entry whose replies would pass. */
static __always_inline int opens_connection(const struct pkt *p)
{
	switch (p->proto) {
	case IPPROTO_TCP:
		return (p->tcp_flags & (TCP_SYN | TCP_ACK | TCP_RST | TCP_FIN)) == TCP_SYN;
	case IPPROTO_ICMP:
		return p->icmp_type == ICMP_ECHO;
	}
	return 1;
}

/* reply_allowed re-checks, once per CT_REPLY_RECHECK_NS, that the policy
 * which admitted a connection still does, before a reply passes on the
 * entry's word: removing an allow ends the reply side of a connection
 * within that bound even when its own direction has gone quiet, so a
 * peer cannot keep it alive by sending. It returns 0 or the drop reason. */
static __always_inline int reply_allowed(struct ct_entry *ct, const struct pkt *p, const int egress,
					 __u32 local_src, __u64 now)
{
	__u32 remote_id, cidr_id;
	int ret, unused;
	__u8 ipc_flags;
	__u16 flags;

	if (now - ct->checked >= CT_REPLY_RECHECK_NS) {
		/* The entry's own direction is the other hook's: the remote
		 * is this packet's source when it comes in, else its
		 * destination. */
		remote_id = remote_identity4(egress ? p->daddr : p->saddr, egress ? 0 : local_src, 1, &cidr_id,
					     &ipc_flags);
		ret = decide(egress ? POLICY_INGRESS : POLICY_EGRESS, remote_id, cidr_id, p->proto,
			     ct->policy_dport, &unused);
		flags = ct->flags & ~(CT_F_DENIED | CT_F_DENYLIST);
		if (ret)
			flags |= CT_F_DENIED | (ret == DROP_POLICY_DENY ? CT_F_DENYLIST : 0);
		ct->flags = flags;
		ct->checked = now;
	}
	if (!(ct->flags & CT_F_DENIED) || POLICY_AUDIT_MODE || (ct->flags & CT_F_AUDIT))
		return 0;
	return ct->flags & CT_F_DENYLIST ? DROP_POLICY_DENY : DROP_POLICY;
}

/* handle applies the endpoint's policy in one direction. local_src, when
 * not 0, is the identity of the local endpoint that sent the packet (the
 * same-node redirect knows it): it is used instead of the ipcache.
 * from_stack is set in cil_to_container only: the packet came through the
 * host stack, and an entry it makes or updates gets CT_F_VIA_STACK. In
 * egress, *reply_via_stack is set when the packet is a reply of such a
 * connection: it must not skip the stack (redirect_local), which has to
 * reverse whatever NAT it applied to the request.
 *
 * The order is the security model's (Documentation/concepts/datapath-security.md):
 * parse (bad headers drop), source validation of what the pod sends,
 * fragments, replies and related ICMP errors of this endpoint's own
 * entries, untranslated packets to a Service frontend (egress), then the
 * policy; only a packet the policy allowed that may open a connection
 * makes an entry. */
static __always_inline int handle(struct __sk_buff *skb, struct pkt *pp, const int egress, __u32 local_src,
				  const int from_stack, int *reply_via_stack)
{
	const __u8 dir = egress ? METRIC_EGRESS : METRIC_INGRESS;
	const __u8 obs = egress ? TRACE_FROM_LXC : TRACE_TO_LXC;
	const __u8 pol_dir = egress ? POLICY_EGRESS : POLICY_INGRESS;
	const __u16 via_stack = from_stack ? CT_F_VIA_STACK : 0;
	struct pkt *p = pp;
	struct ct4_key key = { .endpoint = ENDPOINT_ID };
	struct ct_entry *ct;
	int ret, allow_all, established;
	__u32 remote_id, cidr_id = 0;
	__u8 ipc_flags = 0;
	__u64 now;

	ret = parse_pkt(skb, p);
	if (egress && (ret == PARSE_IPV4 || ret == PARSE_ARP)) {
		int bad = validate_source(skb, p, ret);

		if (bad)
			return drop(skb, p, bad, dir);
	}
	if (ret == PARSE_ARP)
		return pass(skb, p, dir, obs);
	if (ret != PARSE_IPV4)
		return drop(skb, p, ret, dir);
	if (p->frag) {
		ret = frag_ports(p);
		if (ret)
			return drop(skb, p, ret, dir);
	}

	now = ktime_get_ns();

	/* A reply of a connection this endpoint's other hook admitted
	 * passes without a policy lookup of its own, and without an ipcache
	 * lookup: the remote's identity (for the trace event only) is the
	 * one its entry recorded. */
	key.saddr = p->daddr;
	key.daddr = p->saddr;
	key.sport = p->dport;
	key.dport = p->sport;
	key.proto = p->proto;
	key.dir = egress ? CT_DIR_INGRESS : CT_DIR_EGRESS;
	ct = map_lookup_elem(&cellium_ct4, &key);
	if (ct && ct->expires > now) {
		p->src_identity = egress ? SECURITY_IDENTITY : ct->src_identity;
		p->dst_identity = egress ? ct->src_identity : SECURITY_IDENTITY;
		p->ev_flags = EVENT_F_REPLY | EVENT_F_REPLY_KNOWN;
		ret = reply_allowed(ct, p, egress, local_src, now);
		if (ret)
			return drop(skb, p, ret, dir);
		if (egress && (ct->flags & CT_F_VIA_STACK))
			*reply_via_stack = 1;
		ct_update(ct, p, now, 1, 0);
		p->monitor = ct_report(ct, p, now, 1);
		return pass(skb, p, dir, obs);
	}

	/* An ICMP error about a live connection of this endpoint passes
	 * (fragmentation needed keeps path MTU discovery working), whatever
	 * the policy says of ICMP, and changes no entry. */
	if (p->proto == IPPROTO_ICMP && icmp_is_error(p->icmp_type) && ct_related(p, egress, now))
		return pass(skb, p, dir, obs);

	remote_id = remote_identity4(egress ? p->daddr : p->saddr, egress ? 0 : local_src, 0, &cidr_id, &ipc_flags);
	p->src_identity = egress ? SECURITY_IDENTITY : remote_id;
	p->dst_identity = egress ? remote_id : SECURITY_IDENTITY;

	/* A Service frontend address (a ClusterIP) as the destination of a
	 * packet the pod sends: the socket load balancer translates every
	 * connect() and sendmsg() to it, so this packet escaped the socket
	 * hooks (a raw or ping socket, a tun device's stack). The policy
	 * would see the address as world and the host stack might then
	 * DNAT it to a backend the pod's egress policy forbids: drop it,
	 * before conntrack and policy. The flag comes with the ipcache
	 * lookup every non-reply packet makes anyway; replies (above) never
	 * go to a Service address. */
	if (egress && (ipc_flags & IPCACHE_F_SERVICE))
		return drop(skb, p, DROP_IS_CLUSTER_IP, dir);

	key.saddr = p->saddr;
	key.daddr = p->daddr;
	key.sport = p->sport;
	key.dport = p->dport;
	key.dir = egress ? CT_DIR_EGRESS : CT_DIR_INGRESS;
	ct = map_lookup_elem(&cellium_ct4, &key);
	established = ct && ct->expires > now;
	/* A new SYN on a closing tuple starts a new connection. */
	if (established && (ct->flags & CT_F_CLOSING) &&
	    (p->tcp_flags & (TCP_SYN | TCP_ACK)) == TCP_SYN)
		established = 0;
	p->ev_flags = EVENT_F_REPLY_KNOWN;
	/* The Service the connection's socket asked for: looked up once,
	 * for its first packet, and kept in the entry. */
	if (established) {
		p->orig_daddr = ct->orig_daddr;
		p->orig_dport = ct->orig_dport;
	} else {
		sock_orig_dst(skb, p);
	}

	/* Packets of an established connection in its own direction are
	 * checked again, so a policy update that no longer allows it stops
	 * it (bpf/README.md). A denied one keeps its entry, which the
	 * replies' re-check then denies too. */
	ret = policy_verdict(remote_id, pol_dir, p->proto, p->policy_dport, &allow_all);
	/* A same-node source's identity came without the ipcache: look its
	 * address up for the identity of a policy CIDR holding it, whose deny
	 * must win over an allow of the identity (and whose allow may let
	 * what the identity does not). Once per new connection; for a packet
	 * of an established one (the fast path) only when its identity is not
	 * allowed, so a CIDR deny added while such a connection runs stops
	 * its new connections, not it (bpf/README.md). */
	if (!egress && local_src && (!established || ret == DROP_POLICY))
		ipcache_identity4(p->saddr, &cidr_id, &ipc_flags);
	if (cidr_id && cidr_id != remote_id && ret != DROP_POLICY_DENY)
		ret = cidr_verdict(ret, cidr_id, pol_dir, p->proto, p->policy_dport, &allow_all);
	if (established) {
		if (ret && !POLICY_AUDIT_MODE)
			return drop(skb, p, ret, dir);
		ct_update(ct, p, now, 0, via_stack);
		ct->checked = now;
		if (ct->flags & (CT_F_DENIED | CT_F_DENYLIST))
			ct->flags &= ~(CT_F_DENIED | CT_F_DENYLIST);
		p->monitor = ct_report(ct, p, now, 0);
		return pass(skb, p, dir, obs);
	}

	if (ret) {
		if (POLICY_AUDIT_MODE) {
			emit(skb, p, EVENT_POLICY_VERDICT, ret, dir, VERDICT_AUDIT);
		} else {
			emit(skb, p, EVENT_POLICY_VERDICT, ret, dir, VERDICT_DENIED);
			return drop(skb, p, ret, dir);
		}
	}
	if (!opens_connection(p))
		return pass(skb, p, dir, obs);
	if (!ret && !allow_all)
		emit(skb, p, EVENT_POLICY_VERDICT, 0, dir, VERDICT_ALLOWED);

	{
		struct ct_entry entry = {
			.tx_packets = 1,
			.src_identity = remote_id,
			.flags = via_stack,
			.policy_dport = p->policy_dport,
			.checked = now,
			.last_tx_report = (__u32)(now / NSEC_PER_SEC),
			.tx_flags_seen = p->tcp_flags & MONITOR_REPORT_FLAGS,
			.orig_dport = p->orig_dport,
			.orig_daddr = p->orig_daddr,
		};

		if (p->proto == IPPROTO_TCP)
			entry.flags |= CT_F_SYN;
		if (ret)
			entry.flags |= CT_F_AUDIT;
		entry.expires = now + ct_lifetime(p->proto, entry.flags);
		if (map_update_elem(&cellium_ct4, &key, &entry, BPF_ANY) < 0)
			return drop(skb, p, DROP_CT_CREATE_FAILED, dir);
	}
	/* A connection's first packet is always news. */
	p->monitor = 1;
	return pass(skb, p, dir, obs);
}

/* skb->cb slot carrying the source endpoint's identity into the
 * destination's cil_lxc_policy. */
#define CB_SRC_IDENTITY 0

/* redirect_local tail-calls into the destination endpoint's
 * cil_lxc_policy when a packet that passed the source's egress policy is
 * for another local endpoint. It returns only when there is no such
 * endpoint or no program in its cellium_policy_progs slot: the packet then
 * takes the stack, and the destination's cil_to_container checks it. */
static __always_inline int redirect_local(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct endpoint_key key = { .family = CELLIUM_AF_INET };
	struct endpoint_info *info;
	__u8 *ip = data + ETH_HLEN;

	if ((void *)(ip + 20) > data_end || bpf_ntohs(*(__be16 *)(data + 12)) != ETH_P_IP)
		return TC_ACT_OK;
	key.ip[0] = *(__be32 *)(ip + 16);
	info = map_lookup_elem(&cellium_lxc, &key);
	if (!info || info->lxc_id == ENDPOINT_ID)
		return TC_ACT_OK;
	/* The destination's program sees the source's own identity, not
	 * the ipcache's for the source address (as in Cilium). */
	skb->cb[CB_SRC_IDENTITY] = SECURITY_IDENTITY;
	tail_call(skb, &cellium_policy_progs, info->lxc_id);
	skb->cb[CB_SRC_IDENTITY] = 0;
	return TC_ACT_OK;
}

/* cil_from_container applies the endpoint's egress policy and hands a
 * passed packet for another local endpoint to redirect_local, except a
 * reply of a connection whose request came in through the host stack
 * (CT_F_VIA_STACK): the stack may have translated the request (kube-proxy's
 * DNAT of a NodePort, ExternalIP or ClusterIP, a hostPort) and only the
 * stack reverses that on the reply, so the reply takes the stack too. */
SEC("tcx/ingress")
int cil_from_container(struct __sk_buff *skb)
{
	struct pkt p = {};
	int reply_via_stack = 0;
	int ret = handle(skb, &p, 1, 0, 0, &reply_via_stack);

	if (ret != TC_ACT_OK)
		return ret;
	/* A reply of a connection from outside the node that bpf/nodeport.c
	 * translated to this pod: translated back (to the frontend as source,
	 * the client as destination) and sent to the client. After handle,
	 * not before: the pod's conntrack entry and source validation know
	 * the reply as the pod sent it, from its own address; translated,
	 * its source is the node's. */
	if (NODEPORT_ENABLED) {
		ret = nodeport_rev_nat(skb, METRIC_EGRESS, 0);
		if (ret != NP_NOT_NAT)
			return ret;
	}
	if (!reply_via_stack)
		redirect_local(skb);
	/* No other endpoint's program took it (a tail call does not
	 * return): the packet goes to the host stack. */
	trace(skb, &p, METRIC_EGRESS, TRACE_TO_STACK);
	return TC_ACT_OK;
}

/* cil_lxc_policy is this endpoint's ingress policy for packets from
 * another local endpoint, entered by a tail call from the source's
 * cil_from_container (tcx ingress of the source's host veth) through
 * cellium_policy_progs, never attached. A passed packet is routed as the
 * stack would (MACs of this endpoint's veth pair, TTL decremented) and
 * redirected into this endpoint's pod with bpf_redirect_peer, skipping
 * the host stack and cil_to_container. A TTL about to expire goes to the
 * stack, which answers it. */
SEC("tcx/ingress")
int cil_lxc_policy(struct __sk_buff *skb)
{
	struct endpoint_key key = { .family = CELLIUM_AF_INET };
	struct endpoint_info *info;
	struct pkt p = {};
	void *data, *data_end;
	__u16 old_word, new_word;
	__u32 csum;
	__u8 *ip;
	int ret, unused = 0;

	/* Everything that sends the packet to the stack instead is decided
	 * before the policy, which then runs once, here or in
	 * cil_to_container: an expiring TTL, and a slot that is not this
	 * endpoint's (stale, or its endpoint ID reused for another veth). */
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	ip = data + ETH_HLEN;
	if ((void *)(ip + 20) > data_end || bpf_ntohs(*(__be16 *)(data + 12)) != ETH_P_IP)
		return TC_ACT_OK;
	if (ip[8] <= 1)
		return TC_ACT_OK;
	key.ip[0] = *(__be32 *)(ip + 16);
	info = map_lookup_elem(&cellium_lxc, &key);
	if (!info || info->lxc_id != ENDPOINT_ID || info->ifindex != ENDPOINT_IFINDEX)
		return TC_ACT_OK;

	ret = handle(skb, &p, 0, skb->cb[CB_SRC_IDENTITY], 0, &unused);
	if (ret != TC_ACT_OK)
		return ret;

	/* handle may have pulled data: the packet pointers are new. */
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	ip = data + ETH_HLEN;
	if ((void *)(ip + 20) > data_end)
		return TC_ACT_OK;
	__builtin_memcpy(data, info->mac, 6);
	__builtin_memcpy(data + 6, info->node_mac, 6);
	/* TTL and protocol form one 16-bit word of the header checksum:
	 * update it incrementally (RFC 1624: HC' = ~(~HC + ~m + m')). */
	old_word = *(__u16 *)(ip + 8);
	ip[8] -= 1;
	new_word = *(__u16 *)(ip + 8);
	csum = (__u16)~*(__u16 *)(ip + 10);
	csum += (__u16)~old_word;
	csum += new_word;
	csum = (csum & 0xffff) + (csum >> 16);
	csum = (csum & 0xffff) + (csum >> 16);
	*(__u16 *)(ip + 10) = (__u16)~csum;
	return redirect_peer(ENDPOINT_IFINDEX, 0);
}

SEC("tcx/egress")
int cil_to_container(struct __sk_buff *skb)
{
	struct pkt p = {};
	int unused = 0;

	return handle(skb, &p, 0, 0, 1, &unused);
}

char __license[] SEC("license") = "Dual BSD/GPL";
