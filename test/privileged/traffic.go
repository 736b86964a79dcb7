package privileged

// Traffic helpers for privileged tests: send only between network
// namespaces the test made itself.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// Ping sends ICMP echo requests to dst from inside from over a raw socket
// until a reply comes back (at most 5 s).
func Ping(from ns.NetNS, dst netip.Addr) error {
	_, err := PingTTL(from, dst)
	return err
}

// PingTTL is Ping that also returns the TTL of the echo reply (64 minus
// the routed hops on the way back).
func PingTTL(from ns.NetNS, dst netip.Addr) (ttl int, err error) {
	err = from.Do(func(ns.NetNS) error {
		fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW|syscall.SOCK_CLOEXEC, syscall.IPPROTO_ICMP)
		if err != nil {
			return fmt.Errorf("raw socket: %w", err)
		}
		defer syscall.Close(fd)
		tv := syscall.Timeval{Usec: 200_000}
		if err := syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv); err != nil {
			return err
		}
		d4 := dst.As4()
		id := uint16(os.Getpid()) ^ binary.BigEndian.Uint16(d4[2:])
		to := &syscall.SockaddrInet4{Addr: d4}
		buf := make([]byte, 1500)
		deadline := time.Now().Add(5 * time.Second)
		for seq := uint16(1); time.Now().Before(deadline); seq++ {
			if err := syscall.Sendto(fd, echoRequest(id, seq), 0, to); err != nil {
				return fmt.Errorf("send: %w", err)
			}
			for sent := time.Now(); time.Since(sent) < time.Second; {
				n, _, err := syscall.Recvfrom(fd, buf, 0)
				if errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EINTR) {
					continue
				}
				if err != nil {
					return fmt.Errorf("receive: %w", err)
				}
				pkt := buf[:n] // a raw IPv4 socket delivers the IP header too
				if len(pkt) < 20 {
					continue
				}
				ihl := int(pkt[0]&0x0f) * 4
				if len(pkt) < ihl+8 || [4]byte(pkt[12:16]) != d4 {
					continue
				}
				if icmp := pkt[ihl:]; icmp[0] == 0 && binary.BigEndian.Uint16(icmp[4:]) == id {
					ttl = int(pkt[8])
					return nil
				}
			}
		}
		return fmt.Errorf("no echo reply from %s within 5s", dst)
	})
	return ttl, err
}

func echoRequest(id, seq uint16) []byte {
	msg := make([]byte, 8+16)
	msg[0] = 8 // echo request
	binary.BigEndian.PutUint16(msg[4:], id)
	binary.BigEndian.PutUint16(msg[6:], seq)
	copy(msg[8:], "cellium-routing")
	var sum uint32
	for i := 0; i < len(msg); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(msg[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	binary.BigEndian.PutUint16(msg[2:], ^uint16(sum))
	return msg
}

// TCPEcho listens on serverIP inside server, connects from inside client,
// sends msg, reads it back, and returns the client address the server saw.
func TCPEcho(server ns.NetNS, serverIP netip.Addr, client ns.NetNS, msg []byte) (netip.Addr, error) {
	var ln net.Listener
	if err := server.Do(func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(serverIP, 0).String())
		return err
	}); err != nil {
		return netip.Addr{}, fmt.Errorf("listen: %w", err)
	}
	type accepted struct {
		peer netip.Addr
		err  error
	}
	done := make(chan accepted, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- accepted{err: err}
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = io.CopyN(c, c, int64(len(msg)))
		done <- accepted{peer: c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap(), err: err}
	}()
	var conn net.Conn
	err := client.Do(func(ns.NetNS) error {
		var err error
		conn, err = (&net.Dialer{Timeout: 5 * time.Second}).Dial("tcp4", ln.Addr().String())
		return err
	})
	if err != nil {
		ln.Close()
		<-done
		return netip.Addr{}, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	got := make([]byte, len(msg))
	_, werr := conn.Write(msg)
	_, rerr := io.ReadFull(conn, got)
	ln.Close()
	a := <-done
	if err := errors.Join(werr, rerr, a.err); err != nil {
		return netip.Addr{}, err
	}
	if string(got) != string(msg) {
		return netip.Addr{}, fmt.Errorf("echo returned %q, want %q", got, msg)
	}
	return a.peer, nil
}
