package sync

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
)

func TestAdvertisedAddr(t *testing.T) {
	ln := &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 4321}
	any4 := &net.TCPAddr{IP: net.IPv4zero, Port: 4321}
	host := hostIP().String()
	cases := []struct {
		adv  string
		ln   *net.TCPAddr
		want string
		bad  bool
	}{
		{"", ln, "10.1.2.3:4321", false},
		{"", any4, net.JoinHostPort(host, "4321"), false},
		{"", &net.TCPAddr{IP: net.IPv6unspecified, Port: 4321}, net.JoinHostPort(host, "4321"), false},
		{"10.9.9.9:7000", ln, "10.9.9.9:7000", false}, // a proxy or NAT in front
		{"10.9.9.9", ln, "10.9.9.9:4321", false},      // the pod IP alone takes the listener's port
		{"10.9.9.9:0", ln, "10.9.9.9:4321", false},
		{"worker-3.train.svc", any4, "worker-3.train.svc:4321", false},
		{"fd00::5", ln, "[fd00::5]:4321", false},
		{"[fd00::5]", ln, "[fd00::5]:4321", false},
		{"[fd00::5]:99", ln, "[fd00::5]:99", false},
		{":7000", ln, "", true},
		{"[", ln, "", true},
	}
	for _, tc := range cases {
		got, err := advertisedAddr(tc.adv, tc.ln)
		if tc.bad {
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("%q: %q, %v; want ErrInvalid", tc.adv, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("advertisedAddr(%q, %v) = %q, %v; want %q", tc.adv, tc.ln, got, err, tc.want)
		}
	}
}

func TestChooseIP(t *testing.T) {
	a := netip.MustParseAddr
	lo := netIface{name: "lo", up: true, loopback: true, addrs: []netip.Addr{a("127.0.0.1"), a("::1")}}
	docker := netIface{name: "docker0", up: true, addrs: []netip.Addr{a("172.17.0.1")}}
	eth := netIface{name: "eth0", up: true, addrs: []netip.Addr{a("fe80::1"), a("10.0.0.7")}}
	down := netIface{name: "eth1", up: false, addrs: []netip.Addr{a("192.168.9.9")}}
	ll := netIface{name: "eth2", up: true, addrs: []netip.Addr{a("169.254.3.3")}}
	v6 := netIface{name: "eth3", up: true, addrs: []netip.Addr{a("fe80::3"), a("2001:db8::3")}}
	cases := []struct {
		name string
		ifs  []netIface
		def  string
		want string
	}{
		{"the default route's interface wins over an earlier one", []netIface{lo, docker, eth}, "eth0", "10.0.0.7"},
		{"no default route: the first up, non-loopback IPv4", []netIface{lo, down, docker, eth}, "", "172.17.0.1"},
		{"a down default interface is skipped", []netIface{lo, down, eth}, "eth1", "10.0.0.7"},
		{"link-local IPv4 only when nothing else", []netIface{lo, ll, eth}, "", "10.0.0.7"},
		{"link-local IPv4 rather than nothing", []netIface{lo, ll}, "", "169.254.3.3"},
		{"IPv6-only host: its global address", []netIface{lo, v6}, "", "2001:db8::3"},
		{"loopback only", []netIface{lo}, "", "127.0.0.1"},
	}
	for _, tc := range cases {
		if got := chooseIP(tc.ifs, tc.def); got.String() != tc.want {
			t.Errorf("%s: %v, want %s", tc.name, got, tc.want)
		}
	}
}

func TestParseRouteTable(t *testing.T) {
	table := `Iface	Destination	Gateway 	Flags	RefCnt	Use	Metric	Mask		MTU	Window	IRTT
docker0	000011AC	00000000	0001	0	0	0	0000FFFF	0	0	0
eth1	00000000	0101A8C0	0003	0	0	600	00000000	0	0	0
eth0	00000000	0100000A	0003	0	0	100	00000000	0	0	0
eth0	0000000A	00000000	0001	0	0	100	00FFFFFF	0	0	0
wg0	00000000	00000000	0000	0	0	1	00000000	0	0	0
`
	if got := parseRouteTable(bufio.NewScanner(strings.NewReader(table))); got != "eth0" {
		t.Fatalf("default route on %q, want eth0 (lowest metric of the routes that are up)", got)
	}
	if got := parseRouteTable(bufio.NewScanner(strings.NewReader("Iface\tDestination\n"))); got != "" {
		t.Fatalf("no default route: %q", got)
	}
}

// A Transport listening on every address advertises this host's address
// with the port it got; an advertised host alone takes that port.
func TestListenOnAllAddressesAdvertisesTheHost(t *testing.T) {
	cfg := testConfig(t)
	tr, err := Listen(context.Background(), "0.0.0.0:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	host, port, err := net.SplitHostPort(tr.Addr())
	if err != nil || host != hostIP().String() {
		t.Fatalf("Addr %q, want host %v", tr.Addr(), hostIP())
	}
	if p, _ := strconv.Atoi(port); p == 0 {
		t.Fatalf("Addr %q has no port", tr.Addr())
	}
	cfg.AdvertiseAddr = "127.0.0.1"
	tr2, err := Listen(context.Background(), "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer tr2.Close()
	if _, p, _ := net.SplitHostPort(tr2.Addr()); p == "0" || !strings.HasPrefix(tr2.Addr(), "127.0.0.1:") {
		t.Fatalf("Addr %q", tr2.Addr())
	}
	// And the advertised address is what peers reach it on.
	w := &testWorld{cfg: cfg, ts: []*Transport{tr, tr2}, rings: connectAll(t, []*Transport{tr, tr2}, []string{tr.Addr(), tr2.Addr()}, 1)}
	checkBarrier(t, w)
}
