/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * maglev.h: Maglev backend selection of the kube-proxy replacement for
 * traffic from outside the node (bpf/nodeport.c, --bpf-lb-algorithm=maglev).
 * Each NodePort, LoadBalancer, externalIP or hostPort frontend with
 * backends has a table of LB_MAGLEV_TABLE_SIZE backend IDs, computed by
 * the agent (datapath/maglev) and swapped in whole by datapath/lbsync: a
 * new inner array is filled, then replaces the old one in the outer map
 * in one update, so a program never sees a half-written table. A
 * connection's 5-tuple, hashed, picks its slot. Keep in step with
 * datapath/maps/maglev.go.
 */
#ifndef CELLIUM_MAGLEV_H
#define CELLIUM_MAGLEV_H

#include "bpf_api.h"
#include "lb.h"
#include "nodeport.h"

#ifndef BPF_MAP_TYPE_ARRAY
#define BPF_MAP_TYPE_ARRAY 2
#endif
#ifndef BPF_MAP_TYPE_HASH_OF_MAPS
#define BPF_MAP_TYPE_HASH_OF_MAPS 13
#endif
/* An inner map template with it accepts arrays of any size: the table
 * size is a flag, the outer map's pin outlives it. */
#ifndef BPF_F_INNER_MAP
#define BPF_F_INNER_MAP (1U << 12)
#endif

/* The slots of every table (--bpf-lb-maglev-table-size, a prime); 0:
 * --bpf-lb-algorithm=random, no table is read. Set by the loader. */
volatile const __u32 LB_MAGLEV_TABLE_SIZE = 0;
/* The seed of the 5-tuple hash (from --bpf-lb-maglev-hash-seed). */
volatile const __u32 LB_MAGLEV_SEED = 0;

/* The size of the inner map template; the agent creates the tables with
 * LB_MAGLEV_TABLE_SIZE slots (Cilium's default M). */
#define LB_MAGLEV_TEMPLATE_SIZE 16381

/* cellium_lb4_maglev: frontend (address, port, protocol) -> its table,
 * an array of LB_MAGLEV_TABLE_SIZE backend IDs (M*4 bytes each). */
struct lb4_maglev_key {
	__be32 address;
	__be16 dport;
	__u8 proto;
	__u8 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__type(key, struct lb4_maglev_key);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct {
		__uint(type, BPF_MAP_TYPE_ARRAY);
		__uint(key_size, sizeof(__u32));
		__uint(value_size, sizeof(__u32));
		__uint(max_entries, LB_MAGLEV_TEMPLATE_SIZE);
		__uint(map_flags, BPF_F_INNER_MAP);
	});
} cellium_lb4_maglev SEC(".maps");

/* Bob Jenkins' lookup3 final mix (the kernel's jhash_3words). */
#define lb_rol32(x, k) (((x) << (k)) | ((x) >> (32 - (k))))

static __always_inline __u32 lb_jhash_3words(__u32 a, __u32 b, __u32 c, __u32 initval)
{
	initval += 0xdeadbeef + (3 << 2);
	a += initval;
	b += initval;
	c += initval;
	c ^= b; c -= lb_rol32(b, 14);
	a ^= c; a -= lb_rol32(c, 11);
	b ^= a; b -= lb_rol32(a, 25);
	c ^= b; c -= lb_rol32(b, 16);
	a ^= c; a -= lb_rol32(c, 4);
	b ^= a; b -= lb_rol32(a, 14);
	c ^= b; c -= lb_rol32(b, 24);
	return c;
}

/* lb4_maglev_hash hashes a packet's 5-tuple (addresses, ports, protocol)
 * as it arrives from the client. */
static __always_inline __u32 lb4_maglev_hash(const struct np_pkt *p)
{
	return lb_jhash_3words(p->saddr, p->daddr, (__u32)p->sport << 16 | p->dport, LB_MAGLEV_SEED ^ p->proto);
}

/* lb4_maglev_backend returns the backend ID of p's slot in its
 * frontend's table, or 0: the algorithm is random, or the frontend has no
 * table (yet), or the table is of another size (the agent is replacing
 * it after a change of --bpf-lb-maglev-table-size). The caller then picks
 * at random. */
static __always_inline __u32 lb4_maglev_backend(const struct np_pkt *p)
{
	struct lb4_maglev_key key = {};
	__u32 *id, slot;
	void *table;

	if (!LB_MAGLEV_TABLE_SIZE)
		return 0;
	key.address = p->daddr;
	key.dport = p->dport;
	key.proto = p->proto;
	table = map_lookup_elem(&cellium_lb4_maglev, &key);
	if (!table)
		return 0;
	slot = lb4_maglev_hash(p) % LB_MAGLEV_TABLE_SIZE;
	id = map_lookup_elem(table, &slot);
	return id ? *id : 0;
}

#endif /* CELLIUM_MAGLEV_H */
