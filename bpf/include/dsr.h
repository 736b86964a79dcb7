/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * dsr.h: direct server return of the kube-proxy replacement
 * (--bpf-lb-mode=dsr or hybrid, --bpf-lb-dsr-dispatch=opt), used by
 * bpf/nodeport.c only.
 *
 * The node a client's connection arrives at (the frontend's node) sends
 * it to a backend on another node without SNAT, the client's address
 * kept, and puts the frontend (the Service address and port) into an
 * IPv4 option of the packet: Cilium's option, type 0x9a (copied, class 0,
 * number 26), length 8, then the port and the address, both in the byte
 * order Cilium puts on the wire (reversed: the least significant byte of
 * the network-order value first). A TCP connection carries it in its SYN
 * only, any other protocol in every packet.
 *
 * The backend's node (cil_from_netdev on its uplink) reads the option
 * of a packet to one of its endpoints and records the connection in
 * cellium_nodeport_rev4, keyed by the backend's replies (backend ->
 * client), flagged NODEPORT_F_DSR; nodeport_rev_nat in cil_from_container
 * then rewrites the replies' source to the frontend and sends them to the
 * client directly, never through the frontend's node. See
 * Documentation/operations/kube-proxy-replacement-datapath.md.
 */
#ifndef CELLIUM_DSR_H
#define CELLIUM_DSR_H

#include "bpf_api.h"
#include "net.h"
#include "abi.h"
#include "maps.h"
#include "nodeport.h"

/* NODEPORT_LB_MODE (bpf/nodeport.c): --bpf-lb-mode. */
#define NODEPORT_LB_MODE_SNAT 0
#define NODEPORT_LB_MODE_DSR 1    /* DSR for TCP and UDP */
#define NODEPORT_LB_MODE_HYBRID 2 /* DSR for TCP, SNAT for UDP */

/* Cilium's DSR_IPV4_OPT_TYPE: IPOPT_COPY | 26. */
#define DSR_IPV4_OPT_TYPE 0x9a
#define DSR_IPV4_OPT_LEN 8
/* The longest IPv4 header: 15 words. */
#define DSR_IPV4_MAX_HLEN 60

struct dsr_opt4 {
	__u8 type;
	__u8 len;
	__u16 port; /* the frontend's port, byte-reversed network order */
	__u32 addr; /* the frontend's address, byte-reversed network order */
};

/* Helpers only this header uses (prefixed, so bpf_api.h stays as it is). */
static long (*dsr_skb_load_bytes)(const struct __sk_buff *skb, __u32 offset, void *to, __u32 len) = (void *)26;
static long (*dsr_skb_adjust_room)(struct __sk_buff *skb, __s32 len_diff, __u32 mode, __u64 flags) = (void *)50;
#define DSR_ADJ_ROOM_NET 0
/* Keep the skb's checksum state: a CHECKSUM_PARTIAL packet from a pod or
 * a local socket stays partial (its L4 checksum is not recomputed). */
#define DSR_F_ADJ_ROOM_NO_CSUM_RESET (1ULL << 5)

/* dsr_proto reports whether a connection of protocol proto goes by DSR
 * under mode (a NODEPORT_LB_MODE_* value). */
static __always_inline int dsr_proto(__u8 mode, __u8 proto)
{
	return mode == NODEPORT_LB_MODE_DSR || (mode == NODEPORT_LB_MODE_HYBRID && proto == IPPROTO_TCP);
}

/* dsr_local_endpoint reports whether addr is an endpoint of this node. */
static __always_inline int dsr_local_endpoint(__be32 addr)
{
	struct endpoint_key key = {};

	key.ip[0] = addr;
	key.family = CELLIUM_AF_INET;
	return map_lookup_elem(&cellium_lxc, &key) != 0;
}

/* dsr_set_opt4 inserts the DSR option carrying svc_addr:svc_port right
 * after the fixed IPv4 header of the packet p was parsed from (which it
 * moves: p's l4_off is stale afterwards), with the header's length,
 * total length and checksum. It returns 0 or a drop reason. */
static __always_inline int dsr_set_opt4(struct __sk_buff *skb, const struct np_pkt *p, __be32 svc_addr,
					__be16 svc_port)
{
	struct dsr_opt4 opt = {};
	__be16 old_w, new_w, old_len, new_len;
	__u8 vihl[2];
	__u32 words[2];

	if (p->l4_off - ETH_HLEN + DSR_IPV4_OPT_LEN > DSR_IPV4_MAX_HLEN)
		return DROP_CT_INVALID_HDR;
	if (dsr_skb_load_bytes(skb, ETH_HLEN, vihl, 2) < 0 || dsr_skb_load_bytes(skb, ETH_HLEN + 2, &old_len, 2) < 0)
		return DROP_INVALID;
	old_w = *(__be16 *)vihl;
	vihl[0] += DSR_IPV4_OPT_LEN / 4;
	new_w = *(__be16 *)vihl;
	new_len = bpf_htons(bpf_ntohs(old_len) + DSR_IPV4_OPT_LEN);

	opt.type = DSR_IPV4_OPT_TYPE;
	opt.len = DSR_IPV4_OPT_LEN;
	opt.port = __builtin_bswap16(svc_port);
	opt.addr = __builtin_bswap32(svc_addr);
	__builtin_memcpy(words, &opt, sizeof(words));

	if (dsr_skb_adjust_room(skb, DSR_IPV4_OPT_LEN, DSR_ADJ_ROOM_NET, DSR_F_ADJ_ROOM_NO_CSUM_RESET) < 0)
		return DROP_INVALID;
	if (skb_store_bytes(skb, ETH_HLEN, vihl, 2, 0) < 0 || skb_store_bytes(skb, ETH_HLEN + 2, &new_len, 2, 0) < 0 ||
	    skb_store_bytes(skb, ETH_HLEN + 20, &opt, sizeof(opt), 0) < 0)
		return DROP_WRITE_ERROR;
	if (l3_csum_replace(skb, ETH_HLEN + 10, old_w, new_w, 2) < 0 ||
	    l3_csum_replace(skb, ETH_HLEN + 10, old_len, new_len, 2) < 0 ||
	    l3_csum_replace(skb, ETH_HLEN + 10, 0, words[0], 4) < 0 ||
	    l3_csum_replace(skb, ETH_HLEN + 10, 0, words[1], 4) < 0)
		return DROP_WRITE_ERROR;
	return 0;
}

/* dsr_get_opt4 reads the DSR option of packet p into the frontend's
 * address and port (network order). It returns 0, or -1 when the packet
 * has none at the start of its options. */
static __always_inline int dsr_get_opt4(struct __sk_buff *skb, const struct np_pkt *p, __be32 *svc_addr,
					__be16 *svc_port)
{
	struct dsr_opt4 opt;

	if (p->l4_off < ETH_HLEN + 20 + DSR_IPV4_OPT_LEN)
		return -1;
	if (dsr_skb_load_bytes(skb, ETH_HLEN + 20, &opt, sizeof(opt)) < 0)
		return -1;
	if (opt.type != DSR_IPV4_OPT_TYPE || opt.len != DSR_IPV4_OPT_LEN)
		return -1;
	*svc_addr = __builtin_bswap32(opt.addr);
	*svc_port = __builtin_bswap16(opt.port);
	return 0;
}

/* dsr_backend_ingress records a DSR connection at the backend's node: a
 * packet from a client to a local endpoint carrying the option. Its
 * replies (endpoint -> client) then leave with the frontend as source
 * (nodeport_rev_nat in cil_from_container). It returns NP_NOT_NAT for
 * any other packet, else the verdict: the packet goes on to the endpoint
 * through the stack (its ingress policy sees the client's address). */
static __always_inline int dsr_backend_ingress(struct __sk_buff *skb, const struct np_pkt *p, __u64 now)
{
	struct nodeport_rev4_entry rentry = {};
	struct nodeport_rev4_key rkey = {};
	__be32 svc_addr;
	__be16 svc_port;

	if (dsr_get_opt4(skb, p, &svc_addr, &svc_port))
		return NP_NOT_NAT;
	if (!dsr_local_endpoint(p->daddr))
		return NP_NOT_NAT;
	rkey.backend = p->daddr;
	rkey.nat_addr = p->saddr;
	rkey.backend_port = p->dport;
	rkey.nat_port = p->sport;
	rkey.proto = p->proto;
	rentry.client = p->saddr;
	rentry.frontend = svc_addr;
	rentry.client_port = p->sport;
	rentry.frontend_port = svc_port;
	rentry.flags = NODEPORT_F_DSR;
	rentry.expires = now + np_lifetime(p->proto, 0);
	if (map_update_elem(&cellium_nodeport_rev4, &rkey, &rentry, BPF_ANY) < 0)
		return np_drop(skb, p, DROP_CT_CREATE_FAILED, METRIC_INGRESS);
	return TC_ACT_OK;
}

/* dsr_xlate sends a client's packet of a DSR connection on to its backend
 * on another node: destination translated, the source kept, the option
 * added to a TCP SYN and to every packet of other protocols. */
static __always_inline int dsr_xlate(struct __sk_buff *skb, const struct np_pkt *p, __be32 backend,
				     __be16 backend_port)
{
	int ret;

	ret = np_rewrite(skb, p, 0, p->daddr, backend, p->dport, backend_port);
	if (!ret && (p->proto != IPPROTO_TCP || (p->tcp_flags & TCP_SYN)))
		ret = dsr_set_opt4(skb, p, p->daddr, p->dport);
	if (ret)
		return np_drop(skb, p, ret, METRIC_INGRESS);
	ret = np_forward(skb, p, p->saddr, backend);
	if (ret < 0)
		return np_drop(skb, p, -ret, METRIC_INGRESS);
	count(skb->len, REASON_FORWARDED, METRIC_INGRESS);
	return ret;
}

#endif /* CELLIUM_DSR_H */
