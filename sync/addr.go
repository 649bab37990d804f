package sync

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/elastictrain/elastictrain/sync/internal/hostaddr"
)

// advertisedAddr is the address a Transport listening on ln advertises:
// Config.AdvertiseAddr adv (a host alone, or with port 0, takes the
// listener's port), else the listener's address with an unspecified host
// replaced by this host's address (hostIP).
func advertisedAddr(adv string, ln *net.TCPAddr) (string, error) {
	port := strconv.Itoa(ln.Port)
	if adv != "" {
		host, p, err := net.SplitHostPort(adv)
		if err != nil {
			// A host alone ("10.0.0.5", "worker-0.job", "[fd00::5]" or
			// "fd00::5").
			host = strings.TrimSuffix(strings.TrimPrefix(adv, "["), "]")
			if strings.ContainsAny(host, "[]") || host == "" {
				return "", fmt.Errorf("%w: Config.AdvertiseAddr %q: want host or host:port", ErrInvalid, adv)
			}
			return net.JoinHostPort(host, port), nil
		}
		if host == "" {
			return "", fmt.Errorf("%w: Config.AdvertiseAddr %q has no host", ErrInvalid, adv)
		}
		if p == "0" {
			return net.JoinHostPort(host, port), nil
		}
		return adv, nil
	}
	ip, ok := netip.AddrFromSlice(ln.IP)
	if ip = ip.Unmap(); !ok || ip.IsUnspecified() {
		ip = hostIP()
	}
	return net.JoinHostPort(ip.String(), port), nil
}

// netIface is what hostIP needs to know of a network interface.
type netIface struct {
	name     string
	up       bool
	loopback bool
	addrs    []netip.Addr
}

// hostIP returns this host's address for peers: see chooseIP.
func hostIP() netip.Addr {
	var ifs []netIface
	if list, err := net.Interfaces(); err == nil {
		for _, it := range list {
			ni := netIface{name: it.Name, up: it.Flags&net.FlagUp != 0, loopback: it.Flags&net.FlagLoopback != 0}
			if addrs, err := it.Addrs(); err == nil {
				for _, a := range addrs {
					if ipn, ok := a.(*net.IPNet); ok {
						if ip, ok := netip.AddrFromSlice(ipn.IP); ok {
							ni.addrs = append(ni.addrs, ip.Unmap())
						}
					}
				}
			}
			ifs = append(ifs, ni)
		}
	}
	return chooseIP(ifs, defaultRouteIface())
}

// chooseIP picks, in this order: an IPv4 address of the interface that
// holds the default route (defIface, "" if none); the first IPv4 address of
// an interface that is up and not loopback, link-local addresses
// (169.254.0.0/16) last; the first global IPv6 address of such an
// interface; 127.0.0.1.
func chooseIP(ifs []netIface, defIface string) netip.Addr {
	usable := func(it netIface) bool { return it.up && !it.loopback }
	for _, it := range ifs {
		if it.name == defIface && defIface != "" && usable(it) {
			for _, a := range it.addrs {
				if a.Is4() && !a.IsLinkLocalUnicast() && !a.IsLoopback() {
					return a
				}
			}
		}
	}
	for _, linkLocal := range []bool{false, true} {
		for _, it := range ifs {
			if !usable(it) {
				continue
			}
			for _, a := range it.addrs {
				if a.Is4() && !a.IsLoopback() && a.IsLinkLocalUnicast() == linkLocal {
					return a
				}
			}
		}
	}
	for _, it := range ifs {
		if !usable(it) {
			continue
		}
		for _, a := range it.addrs {
			if a.Is6() && a.IsGlobalUnicast() {
				return a
			}
		}
	}
	return netip.AddrFrom4([4]byte{127, 0, 0, 1})
}

// defaultRouteIface returns the interface of the IPv4 default route from
// /proc/net/route (Linux), or "".
func defaultRouteIface() string {
	f, err := os.Open("/proc/net/route")
	if err != nil {
		return ""
	}
	defer f.Close()
	return parseRouteTable(bufio.NewScanner(f))
}

// parseRouteTable reads /proc/net/route's format (a header line, then
// Iface Destination Gateway Flags RefCnt Use Metric Mask ... in hex) and
// returns the interface of the up default route (destination and mask 0)
// with the lowest metric, or "".
func parseRouteTable(sc *bufio.Scanner) string {
	best, bestMetric := "", int64(-1)
	first := true
	for sc.Scan() {
		if first {
			first = false
			continue
		}
		f := strings.Fields(sc.Text())
		if len(f) < 8 || f[1] != "00000000" || f[7] != "00000000" {
			continue
		}
		flags, err := strconv.ParseUint(f[3], 16, 32)
		if err != nil || flags&1 == 0 { // RTF_UP
			continue
		}
		metric, err := strconv.ParseInt(f[6], 10, 64)
		if err != nil {
			continue
		}
		if bestMetric < 0 || metric < bestMetric {
			best, bestMetric = f[0], metric
		}
	}
	return best
}

// isLoopbackHost reports whether an advertised address names this host's
// loopback (127.0.0.0/8, ::1 or "localhost").
func isLoopbackHost(addr string) bool {
	k := hostaddr.Key(addr)
	if ip, err := netip.ParseAddr(k); err == nil {
		return ip.IsLoopback()
	}
	return k == "localhost"
}

// warnLoopback logs when some ranks of w advertise loopback addresses and
// others do not: the loopback ones cannot be reached from another host
// (Connect then times out naming the missing connections).
func (t *Transport) warnLoopback(w World) {
	var loop, other []int
	for r, a := range w.Addrs {
		if a == "" {
			continue
		}
		if isLoopbackHost(a) {
			loop = append(loop, r)
		} else {
			other = append(other, r)
		}
	}
	if len(loop) > 0 && len(other) > 0 {
		t.log.Warn("sync: some ranks advertise a loopback address, which ranks on other hosts cannot reach; "+
			"listen on the host's address (ListenAddr 0.0.0.0:PORT, or set AdvertiseAddr, e.g. to the pod IP)",
			"round", w.Round, "loopback_ranks", loop, "other_ranks", other)
	}
}
