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
 *   cil_sock6_connect, cil_sock6_recvmsg, cil_sock6_getpeername
 *                          cgroup/connect6, recvmsg6, getpeername6: the same
 *                          for a dual-stack AF_INET6 socket and a frontend
 *                          written IPv4-mapped, [::ffff:ClusterIP]:port
 *                          (Java's sockets, for one); real IPv6 addresses
 *                          pass unchanged. Unconnected sendmsg() to such an
 *                          address reaches cil_sock4_sendmsg (see below).
 *
 * Only addresses in cellium_lb4_services are touched: everything else
 * passes unchanged. With --kube-proxy-replacement the map also holds the
 * NodePort frontends (every address of the node, and 0.0.0.0, which stands
 * for the node's loopback: 127.0.0.1:nodePort from the host namespace,
 * HOST_NETNS_COOKIE, reaches the NodePort, from a pod it stays the pod's
 * own loopback), LoadBalancer and externalIP frontends; a frontend whose
 * slot 0 has LB4_SVC_TWO_SCOPES is served from its internal scope
 * (LB4_SCOPE_INT): a socket is always a client inside the cluster. A frontend with session affinity (sessionAffinity:
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
#include "include/net.h"
#include "include/lb.h"

/* HOST_NETNS_COOKIE is the cookie of the node's host network namespace,
 * set at load time (datapath/socklb); 0 stands for the initial one. */
volatile const __u64 HOST_NETNS_COOKIE = 0;

/* in_host_netns reports whether ctx's socket is in the node's host network
 * namespace (the agent's, hostNetwork pods'). */
static __always_inline int in_host_netns(struct bpf_sock_addr *ctx)
{
	__u64 host = HOST_NETNS_COOKIE;

	if (!host)
		host = get_netns_cookie(0);
	return get_netns_cookie(ctx) == host;
}

/* is_v4_loopback reports whether addr is in 127.0.0.0/8. */
static __always_inline int is_v4_loopback(__be32 addr)
{
	return (addr & __builtin_bswap32(0xff000000)) == __builtin_bswap32(0x7f000000);
}

/* sock_proto returns the socket's protocol if the load balancer handles
 * it (TCP, UDP), else 0. */
static __always_inline __u8 sock_proto(const struct bpf_sock_addr *ctx)
{
	__u32 p = ctx->protocol;

	if (p == IPPROTO_TCP || p == IPPROTO_UDP)
		return (__u8)p;
	return 0;
}

/* affinity_backend returns the backend ID the client of akey was sent to
 * for frontend fe, refreshing its entry, or 0 when there is none, it
 * expired or its backend is no backend of fe any more (the entry goes). */
static __always_inline __u32 affinity_backend(const struct lb4_key *fe, const struct lb4_service *svc,
					      const struct lb4_affinity_key *akey, __u64 now)
{
	struct lb4_affinity_value *val;
	__u32 id;

	val = map_lookup_elem(&cellium_lb4_affinity, akey);
	if (!val)
		return 0;
	id = val->backend_id;
	if (!lb4_affinity_valid(fe, svc, id, val->last_used, now)) {
		map_delete_elem(&cellium_lb4_affinity, akey);
		return 0;
	}
	/* Racing sockets of the namespace write the same backend. */
	val->last_used = now;
	return id;
}

/* xlate_fwd translates the IPv4 destination *addr:*port of ctx's socket
 * from a frontend to one of its backends and remembers the frontend for
 * the reverse translation. It returns 1 when it rewrote *addr and *port, 0
 * when they are no frontend (the socket proceeds unchanged),
 * -EHOSTUNREACH when the frontend has no backends. The caller reads and
 * writes the context's address: the v4 and v6 hooks see it in different
 * fields. */
static __always_inline int xlate_fwd(struct bpf_sock_addr *ctx, __be32 *addr, __be16 *port)
{
	struct lb4_reverse_sk_value rval = {};
	struct lb4_affinity_value aval = {};
	struct lb4_affinity_key akey = {};
	struct lb4_reverse_sk_key rkey = {};
	struct lb4_key key = {};
	const struct lb4_service *svc, *slot;
	const struct lb4_backend *be = 0;
	__u8 proto = sock_proto(ctx);
	__be32 orig = *addr;
	__u32 id = 0;
	__u64 now = 0;
	int affinity;

	if (!proto)
		return 0;
	key.address = *addr;
	key.dport = *port;
	key.proto = proto;
	key.scope = LB4_SCOPE_EXT;
	svc = map_lookup_elem(&cellium_lb4_services, &key);
	if (!svc && is_v4_loopback(key.address) && in_host_netns(ctx)) {
		/* 127.0.0.1:nodePort on the node: the NodePort's wildcard
		 * frontend, 0.0.0.0. */
		key.address = 0;
		svc = map_lookup_elem(&cellium_lb4_services, &key);
		if (svc && !(svc->flags & LB4_SVC_NODEPORT))
			svc = 0;
	}
	if (!svc)
		return 0;
	if (svc->flags & LB4_SVC_TWO_SCOPES) {
		/* The agent writes the internal scope before it sets the
		 * flag: a missing one is a frontend being rewritten, served
		 * from its external scope meanwhile. */
		const struct lb4_service *isvc;

		key.scope = LB4_SCOPE_INT;
		isvc = map_lookup_elem(&cellium_lb4_services, &key);
		if (isvc)
			svc = isvc;
		else
			key.scope = LB4_SCOPE_EXT;
	}
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
		lb4_slot_key(&key, svc, (__u16)(get_prandom_u32() % svc->count) + 1);
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
	rval.address = orig; /* 127.0.0.1 for the wildcard, as asked */
	rval.port = key.dport;
	rval.proto = proto;
	/* A full LRU map evicts; an update cannot fail for lack of room. */
	map_update_elem(&cellium_lb4_reverse_sk, &rkey, &rval, BPF_ANY);

	*addr = be->address;
	*port = be->port;
	return 1;
}

/* xlate_rev translates the IPv4 address *addr:*port of ctx's socket from
 * a backend back to the frontend the socket asked for, while that frontend
 * exists. It returns 1 when it rewrote *addr and *port, else 0. */
static __always_inline int xlate_rev(struct bpf_sock_addr *ctx, __be32 *addr, __be16 *port)
{
	struct lb4_reverse_sk_key rkey = {};
	const struct lb4_reverse_sk_value *rval;
	struct lb4_key key = {};

	if (!sock_proto(ctx))
		return 0;
	rkey.cookie = get_socket_cookie(ctx);
	rkey.address = *addr;
	rkey.port = *port;
	rval = map_lookup_elem(&cellium_lb4_reverse_sk, &rkey);
	if (!rval)
		return 0;
	key.address = rval->address;
	if (is_v4_loopback(key.address))
		key.address = 0; /* a NodePort reached at 127.0.0.1 */
	key.dport = rval->port;
	key.proto = rval->proto;
	if (!map_lookup_elem(&cellium_lb4_services, &key)) {
		/* The frontend is gone: show the backend from now on. */
		map_delete_elem(&cellium_lb4_reverse_sk, &rkey);
		return 0;
	}
	*addr = rval->address;
	*port = rval->port;
	return 1;
}

/* fwd_verdict is the verdict of connect()/sendmsg() on xlate_fwd's
 * result. */
static __always_inline int fwd_verdict(int ret)
{
	if (ret < 0) {
		/* connect()/sendmsg() return -ret (kernel >= 5.18; older
		 * kernels answer EPERM to a rejection). */
		set_retval(ret);
		return SYS_REJECT;
	}
	return SYS_PROCEED;
}

/* The v4 hooks: an AF_INET socket's address is in user_ip4. */

static __always_inline int sock4_fwd(struct bpf_sock_addr *ctx)
{
	__be32 addr = ctx->user_ip4;
	__be16 port = (__be16)ctx->user_port;
	int ret = xlate_fwd(ctx, &addr, &port);

	if (ret > 0) {
		ctx->user_ip4 = addr;
		ctx->user_port = (__u32)port;
	}
	return fwd_verdict(ret);
}

static __always_inline void sock4_rev(struct bpf_sock_addr *ctx)
{
	__be32 addr = ctx->user_ip4;
	__be16 port = (__be16)ctx->user_port;

	if (xlate_rev(ctx, &addr, &port)) {
		ctx->user_ip4 = addr;
		ctx->user_port = (__u32)port;
	}
}

SEC("cgroup/connect4")
int cil_sock4_connect(struct bpf_sock_addr *ctx)
{
	return sock4_fwd(ctx);
}

SEC("cgroup/sendmsg4")
int cil_sock4_sendmsg(struct bpf_sock_addr *ctx)
{
	return sock4_fwd(ctx);
}

SEC("cgroup/recvmsg4")
int cil_sock4_recvmsg(struct bpf_sock_addr *ctx)
{
	sock4_rev(ctx);
	return SYS_PROCEED;
}

SEC("cgroup/getpeername4")
int cil_sock4_getpeername(struct bpf_sock_addr *ctx)
{
	sock4_rev(ctx);
	return SYS_PROCEED;
}

/* The v6 hooks: an AF_INET6 socket's address is in user_ip6. Only an
 * IPv4-mapped address (::ffff:a.b.c.d, a dual-stack socket talking IPv4)
 * can be a frontend; its IPv4 address, the last word, goes through the
 * same maps as an AF_INET socket's (the affinity of a namespace is one
 * whatever its sockets' family), and only that word and the port are
 * rewritten, so the socket stays on IPv4 (a backend is always IPv4).
 *
 * There is no sendmsg6 program: for a v4-mapped destination the kernel's
 * udpv6_sendmsg hands the datagram to udp_sendmsg with the IPv4 address,
 * which runs cgroup/sendmsg4 (cil_sock4_sendmsg translates it, the reply
 * goes through cil_sock6_recvmsg); cgroup/sendmsg6 only ever sees real
 * IPv6 destinations, and the kernel fails a sendmsg6 program's rewrite to
 * a v4-mapped address (ENOTSUPP). */

/* The third word of an IPv4-mapped address, 0000:ffff, in network byte
 * order. */
#define V4MAPPED_WORD2 ((__be32)__builtin_bswap32(0x0000ffff))

static __always_inline int sock6_v4mapped(const struct bpf_sock_addr *ctx)
{
	return ctx->user_ip6[0] == 0 && ctx->user_ip6[1] == 0 && ctx->user_ip6[2] == V4MAPPED_WORD2;
}

static __always_inline int sock6_fwd(struct bpf_sock_addr *ctx)
{
	__be32 addr;
	__be16 port;
	int ret;

	if (!sock6_v4mapped(ctx))
		return SYS_PROCEED;
	addr = ctx->user_ip6[3];
	port = (__be16)ctx->user_port;
	ret = xlate_fwd(ctx, &addr, &port);
	if (ret > 0) {
		ctx->user_ip6[3] = addr;
		ctx->user_port = (__u32)port;
	}
	return fwd_verdict(ret);
}

static __always_inline void sock6_rev(struct bpf_sock_addr *ctx)
{
	__be32 addr;
	__be16 port;

	if (!sock6_v4mapped(ctx))
		return;
	addr = ctx->user_ip6[3];
	port = (__be16)ctx->user_port;
	if (xlate_rev(ctx, &addr, &port)) {
		ctx->user_ip6[3] = addr;
		ctx->user_port = (__u32)port;
	}
}

SEC("cgroup/connect6")
int cil_sock6_connect(struct bpf_sock_addr *ctx)
{
	return sock6_fwd(ctx);
}

SEC("cgroup/recvmsg6")
int cil_sock6_recvmsg(struct bpf_sock_addr *ctx)
{
	sock6_rev(ctx);
	return SYS_PROCEED;
}

SEC("cgroup/getpeername6")
int cil_sock6_getpeername(struct bpf_sock_addr *ctx)
{
	sock6_rev(ctx);
	return SYS_PROCEED;
}

char __license[] SEC("license") = "Dual BSD/GPL";
