/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * net.h: the protocol numbers and header constants every program reads
 * packets or sockets with (the kernel's uapi values; the programs include
 * no kernel headers).
 */
#ifndef CELLIUM_NET_H
#define CELLIUM_NET_H

#define ETH_HLEN 14
#define ETH_P_IP 0x0800
#define ETH_P_ARP 0x0806
#define ETH_P_IPV6 0x86DD

#define IPPROTO_ICMP 1
#define IPPROTO_TCP 6
#define IPPROTO_UDP 17
#define IPPROTO_SCTP 132

#define ICMP_ECHOREPLY 0
#define ICMP_DEST_UNREACH 3
#define ICMP_ECHO 8
#define ICMP_TIME_EXCEEDED 11
#define ICMP_PARAMETERPROB 12

#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_ACK 0x10

#define IP_MF 0x2000
#define IP_OFFSET 0x1fff

#define NSEC_PER_SEC 1000000000ULL

#endif /* CELLIUM_NET_H */
