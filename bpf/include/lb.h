/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * lb.h: the structs and maps of the socket load balancer (bpf/sock.c).
 * Keep in step with datapath/maps/lb.go; every struct here gets a Go type
 * through bpf2go -type.
 */
#ifndef CELLIUM_LB_H
#define CELLIUM_LB_H

#include "bpf_api.h"

/* cellium_lb4_services: a frontend (ClusterIP, port, protocol) has slot 0,
 * whose value holds the number of backends in count, and slots 1..count,
 * whose values hold a backend ID each. */
struct lb4_key {
	__be32 address;
	__be16 dport;
	__u8 proto;
	__u8 pad;
	__u16 slot;
	__u16 pad2;
};

struct lb4_service {
	__u32 backend_id; /* slots 1..count */
	__u16 count;      /* slot 0 */
	__u16 pad;
};

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

#endif /* CELLIUM_LB_H */
