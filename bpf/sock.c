// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * sock.c: cellium's socket load balancer, cgroup programs attached to the
 * cgroup v2 root (every socket of the node, in every network namespace).
 *
 *   cil_sock4_connect      cgroup/connect4: connect() to a frontend
 *                          (ClusterIP:port, TCP or UDP) connects to one of
 *                          its backends, chosen at random, or with session
 *                          affinity the one the client had last time.
 *   cil_sock4_sendmsg      cgroup/sendmsg4: the same for sendto()/sendmsg()
 *                          with an address on an unconnected UDP socket.
 *   cil_sock4_recvmsg      cgroup/recvmsg4: a datagram from a backend the
 *                          socket was sent to shows the frontend as its
 *                          source.
 *   cil_sock4_getpeername  cgroup/getpeername4: a socket connected through a
 *                          frontend shows the frontend as its peer.
 *
 * Only addresses in cellium_lb4_services are touched: everything else
 * passes unchanged. A frontend with session affinity (sessionAffinity:
 * ClientIP) keeps sending a client, i.e. a network namespace, to the same
 * backend while its cellium_lb4_affinity entry is younger than the
 * frontend's timeout and cellium_lb4_affinity_match says that backend is
 * still one of the frontend's. A frontend without backends fails connect() and
 * sendmsg() with EHOSTUNREACH, as Cilium's socket LB does. Because the
 * socket's destination is the backend from the start, the packets leave
 * the pod addressed to the backend, and the egress policy of
 * cil_from_container sees the real destination. See
 * Documentation/operations/socket-lb.md.
 */
#include "include/bpf_api.h"
#include "include/lb.h"

#define IPPROTO_TCP 6
#define IPPROTO_UDP 17

/* sock_proto returns the socket's protocol if the load balancer handles
 * it (TCP, UDP), else 0. */
static __always_inline __u8 sock_proto(const struct bpf_sock_addr *ctx)
{
	__u32 p = ctx->protocol;

	if (p == IPPROTO_TCP || p == IPPROTO_UDP)
		return (__u8)p;
	return 0;
}

#define NSEC_PER_SEC 1000000000ULL

/* affinity_backend returns the backend ID the client of akey was sent to
 * for frontend fe, refreshing its entry, or 0 when there is none, it
 * expired or its backend is no backend of fe any more (the entry goes). */
static __always_inline __u32 affinity_backend(const struct lb4_key *fe, const struct lb4_service *svc,
					      const struct lb4_affinity_key *akey, __u64 now)
{
	struct lb4_affinity_match_key mkey = {};
	struct lb4_affinity_value *val;

	val = map_lookup_elem(&cellium_lb4_affinity, akey);
	if (!val)
		return 0;
	mkey.address = fe->address;
	mkey.dport = fe->dport;
	mkey.proto = fe->proto;
	mkey.backend_id = val->backend_id;
	/* Not now - last_used: another CPU may have refreshed the entry
	 * after this program read the clock. */
	if (val->last_used + (__u64)svc->affinity_timeout * NSEC_PER_SEC < now ||
	    !map_lookup_elem(&cellium_lb4_affinity_match, &mkey)) {
		map_delete_elem(&cellium_lb4_affinity, akey);
		return 0;
	}
	/* Racing sockets of the namespace write the same backend. */
	val->last_used = now;
	return mkey.backend_id;
}

/* xlate_fwd rewrites the destination of ctx from a frontend to one of its
 * backends and remembers the frontend for the reverse translation. It
 * returns 0 when the destination was translated or is no frontend (the
 * socket proceeds unchanged), -EHOSTUNREACH when the frontend has no
 * backends. */
static __always_inline int xlate_fwd(struct bpf_sock_addr *ctx)
{
	struct lb4_reverse_sk_value rval = {};
	struct lb4_affinity_value aval = {};
	struct lb4_affinity_key akey = {};
	struct lb4_reverse_sk_key rkey = {};
	struct lb4_key key = {};
	const struct lb4_service *svc, *slot;
	const struct lb4_backend *be = 0;
	__u8 proto = sock_proto(ctx);
	__u32 id = 0;
	__u64 now = 0;
	int affinity;

	if (!proto)
		return 0;
	key.address = ctx->user_ip4;
	key.dport = (__be16)ctx->user_port;
	key.proto = proto;
	svc = map_lookup_elem(&cellium_lb4_services, &key);
	if (!svc)
		return 0;
	if (svc->count == 0)
		return -EHOSTUNREACH;
	affinity = svc->flags & LB4_SVC_AFFINITY;
	if (affinity) {
		akey.netns_cookie = get_netns_cookie(ctx);
		akey.address = key.address;
		akey.dport = key.dport;
		akey.proto = key.proto;
		now = ktime_get_ns();
		id = affinity_backend(&key, svc, &akey, now);
		if (id)
			be = map_lookup_elem(&cellium_lb4_backends, &id);
	}
	if (!be) {
		key.slot = (__u16)(get_prandom_u32() % svc->count) + 1;
		slot = map_lookup_elem(&cellium_lb4_services, &key);
		if (!slot)
			return 0;
		id = slot->backend_id;
		be = map_lookup_elem(&cellium_lb4_backends, &id);
		if (!be)
			return 0;
		if (affinity) {
			aval.backend_id = id;
			aval.last_used = now;
			map_update_elem(&cellium_lb4_affinity, &akey, &aval, BPF_ANY);
		}
	}

	rkey.cookie = get_socket_cookie(ctx);
	rkey.address = be->address;
	rkey.port = be->port;
	rval.address = key.address;
	rval.port = key.dport;
	rval.proto = proto;
	/* A full LRU map evicts; an update cannot fail for lack of room. */
	map_update_elem(&cellium_lb4_reverse_sk, &rkey, &rval, BPF_ANY);

	ctx->user_ip4 = be->address;
	ctx->user_port = (__u32)be->port;
	return 0;
}

/* xlate_rev rewrites a backend address of ctx back to the frontend the
 * socket asked for, while that frontend exists. */
static __always_inline void xlate_rev(struct bpf_sock_addr *ctx)
{
	struct lb4_reverse_sk_key rkey = {};
	const struct lb4_reverse_sk_value *rval;
	struct lb4_key key = {};

	if (!sock_proto(ctx))
		return;
	rkey.cookie = get_socket_cookie(ctx);
	rkey.address = ctx->user_ip4;
	rkey.port = (__be16)ctx->user_port;
	rval = map_lookup_elem(&cellium_lb4_reverse_sk, &rkey);
	if (!rval)
		return;
	key.address = rval->address;
	key.dport = rval->port;
	key.proto = rval->proto;
	if (!map_lookup_elem(&cellium_lb4_services, &key)) {
		/* The frontend is gone: show the backend from now on. */
		map_delete_elem(&cellium_lb4_reverse_sk, &rkey);
		return;
	}
	ctx->user_ip4 = rval->address;
	ctx->user_port = (__u32)rval->port;
}

static __always_inline int fwd_verdict(struct bpf_sock_addr *ctx)
{
	int err = xlate_fwd(ctx);

	if (err) {
		/* connect()/sendmsg() return -err (kernel >= 5.18; older
		 * kernels answer EPERM to a rejection). */
		set_retval(err);
		return SYS_REJECT;
	}
	return SYS_PROCEED;
}

SEC("cgroup/connect4")
int cil_sock4_connect(struct bpf_sock_addr *ctx)
{
	return fwd_verdict(ctx);
}

SEC("cgroup/sendmsg4")
int cil_sock4_sendmsg(struct bpf_sock_addr *ctx)
{
	return fwd_verdict(ctx);
}

SEC("cgroup/recvmsg4")
int cil_sock4_recvmsg(struct bpf_sock_addr *ctx)
{
	xlate_rev(ctx);
	return SYS_PROCEED;
}

SEC("cgroup/getpeername4")
int cil_sock4_getpeername(struct bpf_sock_addr *ctx)
{
	xlate_rev(ctx);
	return SYS_PROCEED;
}

char __license[] SEC("license") = "Dual BSD/GPL";
