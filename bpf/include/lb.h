/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * lb.h: the structs and maps of the socket load balancer (bpf/sock.c).
 * Keep in step with datapath/maps/lb.go; every struct here gets a Go type
 * through bpf2go -type.
 */
#ifndef CELLIUM_LB_H
#define CELLIUM_LB_H

#include "bpf_api.h"
#include "net.h"

/* cellium_lb4_services: a frontend (ClusterIP, port, protocol) has slot 0,
 * whose value holds the number of backends in count and the frontend's
 * flags and session affinity timeout, and slots 1..count, whose values
 * hold a backend ID each. The slots are in one of two banks: slot 0 (always
 * bank 0) flagged LB4_SVC_BANK1 has them in bank 1. The agent writes a new
 * version of the backends into the bank not in use, then slot 0, then
 * deletes the old bank's slots: a program sees the old set or the new
 * one, never a mix (lb4_slot_key). */
struct lb4_key {
	__be32 address;
	__be16 dport;
	__u8 proto;
	__u8 scope; /* LB4_SCOPE_EXT or LB4_SCOPE_INT */
	__u16 slot;
	__u16 bank; /* 0 or 1; slot 0 is in bank 0 */
};

/* lb4_service.flags (slot 0). */
#define LB4_SVC_AFFINITY 0x1 /* sessionAffinity: ClientIP */
#define LB4_SVC_NODEPORT 0x2   /* NodePort, LoadBalancer or externalIP frontend: also served to outside clients (bpf/nodeport.c) */
#define LB4_SVC_LOCAL 0x4      /* externalTrafficPolicy Local: the external scope's slots hold only this node's backends; the client address is kept */
#define LB4_SVC_TWO_SCOPES 0x8 /* an internal-scope entry (scope LB4_SCOPE_INT) exists for traffic from inside the cluster */
/* loadBalancerSourceRanges (external scope only): a client from outside the
 * node passes only when cellium_lb4_source_range has a prefix of its
 * address for this frontend (bpf/nodeport.c; Cilium's SVC_FLAG_SOURCE_RANGE).
 * The agent writes the prefixes before it sets the flag and removes them
 * after it cleared it. */
#define LB4_SVC_SOURCE_RANGE 0x10
/* The slots 1..count of this scope are in bank 1 (lb4_key.bank). */
#define LB4_SVC_BANK1 0x20
#define LB4_SCOPE_EXT 0
#define LB4_SCOPE_INT 1

struct lb4_service {
	union {
		__u32 backend_id;       /* slots 1..count */
		__u32 affinity_timeout; /* slot 0: seconds, with LB4_SVC_AFFINITY */
	};
	__u16 count; /* slot 0 */
	__u8 flags;  /* slot 0: LB4_SVC_* */
	__u8 pad;
};

/* lb4_slot_key points key (slot 0 of a scope, whose value is svc) at
 * slot n of the scope's current bank. */
static __always_inline void lb4_slot_key(struct lb4_key *key, const struct lb4_service *svc, __u16 n)
{
	key->slot = n;
	key->bank = (svc->flags & LB4_SVC_BANK1) ? 1 : 0;
}

/* cellium_lb4_backends: backend ID -> address and port. */
struct lb4_backend {
	__be32 address;
	__be16 port;
	__u8 proto;
	__u8 pad;
};

/* cellium_lb4_reverse_sk: written by the programs when they translate a
 * socket's destination; read back by recvmsg4 and getpeername4 to show
 * the application the frontend it asked for. */
struct lb4_reverse_sk_key {
	__u64 cookie;
	__be32 address;
	__be16 port;
	__u16 pad;
};

struct lb4_reverse_sk_value {
	__be32 address;
	__be16 port;
	__u8 proto;
	__u8 pad;
};

/* cellium_lb4_affinity: the backend a client (the socket's network
 * namespace, by its cookie) was sent to for a frontend with session
 * affinity, and when it last was (bpf_ktime_get_ns). */
struct lb4_affinity_key {
	__u64 netns_cookie;
	__be32 address;
	__be16 dport;
	__u8 proto;
	__u8 pad;
};

struct lb4_affinity_value {
	__u64 last_used;
	__u32 backend_id;
	__u32 pad;
};

/* cellium_lb4_affinity_match: (frontend, backend ID) for every backend a
 * frontend has, written by the agent: an affinity entry whose backend is
 * not a backend of its frontend any more is stale. */
struct lb4_affinity_match_key {
	__be32 address;
	__be16 dport;
	__u8 proto;
	__u8 pad;
	__u32 backend_id;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb4_key);
	__type(value, struct lb4_service);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cellium_lb4_services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct lb4_backend);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cellium_lb4_backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb4_reverse_sk_key);
	__type(value, struct lb4_reverse_sk_value);
	__uint(max_entries, 262144);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cellium_lb4_reverse_sk SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb4_affinity_key);
	__type(value, struct lb4_affinity_value);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cellium_lb4_affinity SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb4_affinity_match_key);
	__type(value, __u8);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cellium_lb4_affinity_match SEC(".maps");

/* cellium_lb4_source_range: (frontend, client prefix) for the frontends
 * flagged LB4_SVC_SOURCE_RANGE (Cilium's cilium_lb4_source_range, keyed
 * here by the frontend instead of its rev-NAT ID). prefixlen is
 * LB4_SRC_RANGE_STATIC_PREFIX plus the client prefix's length. */
struct lb4_src_range_key {
	__u32 prefixlen;
	__be32 address;
	__be16 dport;
	__u8 proto;
	__u8 pad;
	__be32 saddr;
};

#define LB4_SRC_RANGE_STATIC_PREFIX 64

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct lb4_src_range_key);
	__type(value, __u8);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cellium_lb4_source_range SEC(".maps");

/* lb4_src_range_ok reports whether client saddr may use frontend fe,
 * whose slot 0 is svc: always without LB4_SVC_SOURCE_RANGE, else when one
 * of the frontend's prefixes holds it. */
static __always_inline int lb4_src_range_ok(const struct lb4_key *fe, const struct lb4_service *svc, __be32 saddr)
{
	struct lb4_src_range_key key = {
		.prefixlen = LB4_SRC_RANGE_STATIC_PREFIX + 32,
		.address = fe->address,
		.dport = fe->dport,
		.proto = fe->proto,
		.saddr = saddr,
	};

	if (!(svc->flags & LB4_SVC_SOURCE_RANGE))
		return 1;
	return map_lookup_elem(&cellium_lb4_source_range, &key) != 0;
}

/* lb4_affinity_valid reports whether a client's affinity entry (the
 * backend it was sent to and when, bpf_ktime_get_ns) still holds for
 * frontend fe, whose slot 0 is svc: not older than the frontend's timeout
 * and its backend still a backend of fe. Compared as last_used + timeout <
 * now, not now - last_used: another CPU may have refreshed the entry after
 * the caller read the clock. sock.c keys entries by the client's network
 * namespace, nodeport.c by the client's address. */
static __always_inline int lb4_affinity_valid(const struct lb4_key *fe, const struct lb4_service *svc,
					      __u32 backend_id, __u64 last_used, __u64 now)
{
	struct lb4_affinity_match_key mkey = {
		.address = fe->address,
		.dport = fe->dport,
		.proto = fe->proto,
		.backend_id = backend_id,
	};

	return last_used + (__u64)svc->affinity_timeout * NSEC_PER_SEC >= now &&
	       map_lookup_elem(&cellium_lb4_affinity_match, &mkey);
}
#endif /* CELLIUM_LB_H */
