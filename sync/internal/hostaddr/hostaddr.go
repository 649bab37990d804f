// Package hostaddr tells which ranks share a host, from the addresses they
// advertise: the ring's host layout (package sync) and the parameter
// server's replica placement (sync/paramserver) group ranks by it.
package hostaddr

import (
	"net"
	"net/netip"
	"strings"
)

// Key is the host part of an advertised address (host:port, or a bare
// host), normalised so that equal hosts compare equal: an IP address in its
// canonical form (IPv4-mapped IPv6 unmapped, zone dropped), a name in
// lower case.
func Key(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if ip, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return ip.Unmap().WithZone("").String()
	}
	return strings.ToLower(host)
}
