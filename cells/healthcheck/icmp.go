package healthcheck

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"time"
)

// Ping sends one ICMP echo request to dst and waits for its reply until
// ctx ends, and returns the round trip. It uses an unprivileged ICMP
// ("ping") socket when net.ipv4.ping_group_range admits the process's
// group, else a raw socket, which needs CAP_NET_RAW (the agent's
// DaemonSet grants it). IPv4 only.
func Ping(ctx context.Context, dst netip.Addr) (time.Duration, error) {
	if !dst.Unmap().Is4() {
		return 0, fmt.Errorf("ping %s: only IPv4 is probed", dst)
	}
	d4 := dst.Unmap().As4()
	raw := false
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, syscall.IPPROTO_ICMP)
	if err != nil {
		raw = true
		fd, err = syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW|syscall.SOCK_CLOEXEC, syscall.IPPROTO_ICMP)
		if err != nil {
			return 0, fmt.Errorf("ping %s: no ICMP socket (neither net.ipv4.ping_group_range admits this group nor has the agent CAP_NET_RAW): %w", dst, err)
		}
	}
	defer syscall.Close(fd)
	tv := syscall.Timeval{Usec: 100_000}
	if err := syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv); err != nil {
		return 0, fmt.Errorf("ping %s: %w", dst, err)
	}
	var token [16]byte
	_, _ = rand.Read(token[:])
	id := binary.BigEndian.Uint16(token[:2])
	seq := binary.BigEndian.Uint16(token[2:4])
	start := time.Now()
	if err := syscall.Sendto(fd, echoRequest(id, seq, token[:]), 0, &syscall.SockaddrInet4{Addr: d4}); err != nil {
		return 0, fmt.Errorf("ping %s: send: %w", dst, err)
	}
	buf := make([]byte, 1500)
	for ctx.Err() == nil {
		n, from, err := syscall.Recvfrom(fd, buf, 0)
		if errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("ping %s: receive: %w", dst, err)
		}
		pkt := buf[:n]
		if raw { // a raw socket delivers the IP header too
			if len(pkt) < 20 || len(pkt) < int(pkt[0]&0x0f)*4 {
				continue
			}
			pkt = pkt[int(pkt[0]&0x0f)*4:]
		}
		if sa, ok := from.(*syscall.SockaddrInet4); !ok || sa.Addr != d4 {
			continue
		}
		// Echo reply with our sequence and token (a ping socket
		// rewrites the identifier).
		if len(pkt) >= 8+len(token) && pkt[0] == 0 && binary.BigEndian.Uint16(pkt[6:]) == seq &&
			string(pkt[8:8+len(token)]) == string(token[:]) {
			return time.Since(start), nil
		}
	}
	return 0, fmt.Errorf("ping %s: no echo reply: %w", dst, ctx.Err())
}

// echoRequest is an ICMP echo request carrying payload.
func echoRequest(id, seq uint16, payload []byte) []byte {
	msg := make([]byte, 8+len(payload))
	msg[0] = 8
	binary.BigEndian.PutUint16(msg[4:], id)
	binary.BigEndian.PutUint16(msg[6:], seq)
	copy(msg[8:], payload)
	var sum uint32
	for i := 0; i+1 < len(msg); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(msg[i:]))
	}
	if len(msg)%2 == 1 {
		sum += uint32(msg[len(msg)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	binary.BigEndian.PutUint16(msg[2:], ^uint16(sum))
	return msg
}
