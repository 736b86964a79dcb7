/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * bpf_api.h: the few kernel types, constants and helper declarations the
 * cellium programs use. Written out here instead of included from
 * linux-libc-dev or libbpf so that the object (and its BTF) does not depend
 * on the header versions of the build machine: `make bpf` is byte for byte
 * reproducible with the same clang-19.
 */
#ifndef CELLIUM_BPF_API_H
#define CELLIUM_BPF_API_H

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef signed char __s8;
typedef short __s16;
typedef int __s32;
typedef long long __s64;
typedef __u16 __be16;
typedef __u32 __be32;

#define SEC(name) __attribute__((section(name), used))
#define __always_inline inline __attribute__((always_inline))

/* BTF map definitions, the layout libbpf and cilium/ebpf read. */
#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name
#define __array(name, val) typeof(val) *name[]

/* Map types and flags (include/uapi/linux/bpf.h). */
#define BPF_MAP_TYPE_HASH 1
#define BPF_MAP_TYPE_PROG_ARRAY 3
#define BPF_MAP_TYPE_PERCPU_HASH 5
#define BPF_MAP_TYPE_PERCPU_ARRAY 6
#define BPF_MAP_TYPE_LRU_HASH 9
#define BPF_MAP_TYPE_LPM_TRIE 11
#define BPF_MAP_TYPE_ARRAY_OF_MAPS 12
#define BPF_MAP_TYPE_RINGBUF 27
#define BPF_F_NO_PREALLOC (1U << 0)
#define LIBBPF_PIN_NONE 0
#define LIBBPF_PIN_BY_NAME 1

/* map_update_elem flags. */
#define BPF_ANY 0
#define BPF_NOEXIST 1

/* tc / tcx verdicts. TC_ACT_OK is TCX_PASS, TC_ACT_SHOT is TCX_DROP. */
#define TC_ACT_OK 0
#define TC_ACT_SHOT 2
#define TC_ACT_REDIRECT 7

/* Errno values the helpers return negated. */
#define EEXIST 17
#define EHOSTUNREACH 113

/* cgroup sock_addr verdicts. */
#define SYS_REJECT 0
#define SYS_PROCEED 1

/* The start of struct __sk_buff (include/uapi/linux/bpf.h): context
 * accesses are by offset, so the fields up to data_end are enough. */
struct __sk_buff {
	__u32 len;
	__u32 pkt_type;
	__u32 mark;
	__u32 queue_mapping;
	__u32 protocol;
	__u32 vlan_present;
	__u32 vlan_tci;
	__u32 vlan_proto;
	__u32 priority;
	__u32 ingress_ifindex;
	__u32 ifindex;
	__u32 tc_index;
	__u32 cb[5];
	__u32 hash;
	__u32 tc_classid;
	__u32 data;
	__u32 data_end;
};

/* struct bpf_tunnel_key (include/uapi/linux/bpf.h): the tunnel metadata
 * of a packet on a collect-metadata (external) tunnel device. remote_ipv4
 * is in host byte order. */
struct bpf_tunnel_key {
	__u32 tunnel_id;
	union {
		__u32 remote_ipv4;
		__u32 remote_ipv6[4];
	};
	__u8 tunnel_tos;
	__u8 tunnel_ttl;
	union {
		__u16 tunnel_ext;
		__be16 tunnel_flags;
	};
	__u32 tunnel_label;
	union {
		__u32 local_ipv4;
		__u32 local_ipv6[4];
	};
};

/* skb_set_tunnel_key flags. */
#define BPF_F_ZERO_CSUM_TX (1ULL << 1)
#define BPF_F_DONT_FRAGMENT (1ULL << 2)

/* skb->pkt_type values (include/uapi/linux/if_packet.h). */
#define PACKET_HOST 0

/* struct bpf_sock_addr (include/uapi/linux/bpf.h), up to msg_src_ip6: the
 * context of the cgroup connect4/6, sendmsg4, recvmsg4/6, getpeername4/6
 * programs. Addresses and ports are in network byte order; the port is
 * the low 16 bits of user_port. */
struct bpf_sock_addr {
	__u32 user_family;
	__u32 user_ip4;
	__u32 user_ip6[4];
	__u32 user_port;
	__u32 family;
	__u32 type;
	__u32 protocol;
	__u32 msg_src_ip4;
	__u32 msg_src_ip6[4];
};

/* Helpers, by their stable numbers (enum bpf_func_id). */
static void *(*map_lookup_elem)(void *map, const void *key) = (void *)1;
static long (*map_update_elem)(void *map, const void *key, const void *value, __u64 flags) = (void *)2;
static long (*map_delete_elem)(void *map, const void *key) = (void *)3;
static __u64 (*ktime_get_ns)(void) = (void *)5;
static long (*skb_pull_data)(struct __sk_buff *skb, __u32 len) = (void *)39;
static void *(*ringbuf_reserve)(void *ringbuf, __u64 size, __u64 flags) = (void *)131;
static void (*ringbuf_submit)(void *data, __u64 flags) = (void *)132;
static long (*tail_call)(void *ctx, void *prog_array_map, __u32 index) = (void *)12;
static long (*redirect_peer)(__u32 ifindex, __u64 flags) = (void *)155;
static __u32 (*get_prandom_u32)(void) = (void *)7;
static __u64 (*get_socket_cookie)(void *ctx) = (void *)46;
static long (*set_retval)(int retval) = (void *)187;
static __u64 (*get_netns_cookie)(void *ctx) = (void *)122;
static long (*skb_get_tunnel_key)(struct __sk_buff *skb, struct bpf_tunnel_key *key, __u32 size,
				  __u64 flags) = (void *)20;
static long (*skb_set_tunnel_key)(struct __sk_buff *skb, struct bpf_tunnel_key *key, __u32 size,
				  __u64 flags) = (void *)21;
static long (*skb_change_type)(struct __sk_buff *skb, __u32 type) = (void *)32;

/* struct bpf_fib_lookup (include/uapi/linux/bpf.h), 64 bytes: the input
 * and output of the fib_lookup helper, IPv4 only here (the IPv6 address
 * unions are padded to their size). smac and dmac share their place with
 * the input-only mark of newer kernels. */
struct bpf_fib_lookup {
	__u8 family;
	__u8 l4_protocol;
	__be16 sport;
	__be16 dport;
	__u16 tot_len; /* in: the datagram's length; out: mtu_result */
	__u32 ifindex; /* in: the ingress device; out: the egress device */
	__u32 tos;
	__be32 ipv4_src;
	__u32 src_pad[3];
	__be32 ipv4_dst;
	__u32 dst_pad[3];
	__u32 vlan; /* out: h_vlan_proto, h_vlan_TCI */
	__u8 smac[6];
	__u8 dmac[6];
};

/* fib_lookup results (enum BPF_FIB_LKUP_RET_*). */
#define BPF_FIB_LKUP_RET_SUCCESS 0
#define BPF_FIB_LKUP_RET_NO_NEIGH 7

/* l3_csum_replace / l4_csum_replace flags. */
#define BPF_F_PSEUDO_HDR (1ULL << 4)
#define BPF_F_MARK_MANGLED_0 (1ULL << 5)

static long (*skb_store_bytes)(struct __sk_buff *skb, __u32 offset, const void *from, __u32 len,
			       __u64 flags) = (void *)9;
static long (*l3_csum_replace)(struct __sk_buff *skb, __u32 offset, __u64 from, __u64 to, __u64 size) = (void *)10;
static long (*l4_csum_replace)(struct __sk_buff *skb, __u32 offset, __u64 from, __u64 to, __u64 flags) = (void *)11;
static long (*redirect)(__u32 ifindex, __u64 flags) = (void *)23;
static long (*fib_lookup)(void *ctx, struct bpf_fib_lookup *params, int plen, __u32 flags) = (void *)69;
static long (*redirect_neigh)(__u32 ifindex, void *params, int plen, __u64 flags) = (void *)152;

/* Byte order: the programs are built for bpfel only. */
#define bpf_htons(x) ((__be16)__builtin_bswap16(x))
#define bpf_ntohs(x) ((__u16)__builtin_bswap16(x))
#define bpf_htonl(x) ((__be32)__builtin_bswap32(x))
#define bpf_ntohl(x) ((__u32)__builtin_bswap32(x))

#endif /* CELLIUM_BPF_API_H */
