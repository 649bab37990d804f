// Package netns makes "hosts" for tests and benchmarks out of Linux network
// namespaces: each host is a namespace with its own IPv4 address on a
// private /24, joined to the others by a veth pair and one bridge in the
// caller's namespace, so processes on different hosts talk over real links
// (not loopback) that a test can cap, cut and restore.
//
// # Topology
//
//	root namespace:  bridge etb-P-S (gateway .254)  <- veth etv-P-S-I ->  namespace et-P-S-NAME: eth0 (.I+1), lo
//
// P is the creating process's PID and S a sequence number (both base 36),
// so that several test binaries can run at once and a later New can remove
// what a killed process left behind. The caller's namespace reaches every
// host through the bridge (Gateway), so a test can run Redis or a proxy in
// either place.
//
// # Links
//
// Cap limits both directions of a host's link with the token-bucket filter
// (tc tbf, on the host's eth0 and on the bridge end of its veth); Cut sets
// the bridge end down (the host keeps its address but no packet passes,
// like a pulled cable: connections see no reset, only silence) and Restore
// sets it up again. The kernels this runs on may lack netem, so latency is
// added in user space: put a faultinject.Proxy on the path (listening on
// Gateway, forwarding to a host) and call its SetLatency.
//
// # Processes
//
// Host.Command builds an exec.Cmd that runs inside the host's namespace
// through `ip netns exec` (which execs, so the Cmd's process is the
// program itself). Close kills every process still in the namespaces
// (started here or not), then deletes the namespaces, veths and bridge.
//
// # Requirements
//
// Linux, iproute2's `ip` and `tc`, and CAP_NET_ADMIN (root). Available
// reports why namespaces cannot be made; ForTest skips a test then, except
// with CI=true, where it fails it: CI runs as root and must run these
// tests.
//
// A Net's methods are safe for concurrent use.
package netns

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// ErrUnavailable is wrapped by Available's error and by New when this
// process cannot make network namespaces.
var ErrUnavailable = errors.New("netns: network namespaces unavailable")

// Net is a set of hosts joined by one bridge. Close removes it.
type Net struct {
	id      string // "P-S"
	bridge  string
	prefix  netip.Prefix
	gateway netip.Addr

	// life ends when Close starts: every Cmd made by Host.Command is
	// killed then (exec.CommandContext), even one that had not yet entered
	// its namespace when Close looked for the processes inside.
	life    context.Context
	endLife context.CancelFunc

	mu       sync.Mutex
	hosts    []*Host
	forwards []*forwarder
	closed   bool
}

// Host is one network namespace of a Net.
type Host struct {
	net   *Net
	name  string
	ns    string
	ip    netip.Addr
	veth  string // the bridge end, in the caller's namespace
	index int

	mu     sync.Mutex
	capped int64 // bits per second; 0 = none
	cut    bool
}

var seq atomic.Uint32

// names of this process's resources
func idOf(pid int, s uint32) string {
	return strconv.FormatInt(int64(pid), 36) + "-" + strconv.FormatInt(int64(s), 36)
}

var avail struct {
	once sync.Once
	err  error
}

// Available returns nil when this process can make network namespaces
// (Linux, ip and tc on PATH, and the privilege to add a namespace, tried
// once per process), else an error wrapping ErrUnavailable that says why.
func Available() error {
	avail.once.Do(func() { avail.err = probe() })
	return avail.err
}

func probe() error {
	if runtime.GOOS != "linux" {
		return fmt.Errorf("%w: %s is not Linux", ErrUnavailable, runtime.GOOS)
	}
	for _, bin := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Errorf("%w: %s (iproute2) not on PATH: %v", ErrUnavailable, bin, err)
		}
	}
	name := "et-" + idOf(os.Getpid(), seq.Add(1)) + "-probe"
	if out, err := run(context.Background(), "ip", "netns", "add", name); err != nil {
		return fmt.Errorf("%w: ip netns add: %v: %s (needs root or CAP_NET_ADMIN)", ErrUnavailable, err, out)
	}
	if out, err := run(context.Background(), "ip", "netns", "del", name); err != nil {
		return fmt.Errorf("%w: ip netns del: %v: %s", ErrUnavailable, err, out)
	}
	return nil
}

// RequireForTest skips t, with the reason, where this process cannot make
// network namespaces (Available), unless CI=true, where it fails t: CI
// runs as root and these tests must run there. For a test whose program
// makes the namespaces itself (an example's -hosts); ForTest calls it.
func RequireForTest(t testing.TB) {
	t.Helper()
	if err := Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%v (CI=true: namespace tests must run in CI, which runs as root with iproute2)", err)
		}
		t.Skipf("%v; this test needs Linux network namespaces (run it as root with iproute2 installed)", err)
	}
}

// ForTest returns a Net with the named hosts for t, removed by t.Cleanup
// (also when t fails). Where namespaces cannot be made it skips t with the
// reason, unless CI=true, where it fails t: CI runs as root and these tests
// must run there.
func ForTest(t testing.TB, hosts ...string) *Net {
	t.Helper()
	RequireForTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := New(ctx, hosts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("netns cleanup: %v", err)
		}
	})
	return n
}

// New makes a bridge and one namespace per name in hosts (names: 1 to 20
// characters of [a-z0-9], distinct; at most 250 hosts), host i getting
// address .i+1 of a free private /24 (10.200.0.0 - 10.255.255.0; the
// bridge has .254). It first removes what earlier processes that no longer
// run left behind. On error nothing of the new Net remains.
func New(ctx context.Context, hosts ...string) (*Net, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	if len(hosts) == 0 || len(hosts) > 250 {
		return nil, fmt.Errorf("netns: %d hosts, want 1..250", len(hosts))
	}
	seen := map[string]bool{}
	for _, h := range hosts {
		if !validName(h) || seen[h] {
			return nil, fmt.Errorf("netns: host name %q: want 1-20 characters of [a-z0-9], distinct", h)
		}
		seen[h] = true
	}
	sweep(ctx)
	prefix, err := freePrefix()
	if err != nil {
		return nil, err
	}
	id := idOf(os.Getpid(), seq.Add(1))
	base := prefix.Addr().As4()
	n := &Net{id: id, bridge: "etb-" + id, prefix: prefix}
	n.life, n.endLife = context.WithCancel(context.Background())
	n.gateway = netip.AddrFrom4([4]byte{base[0], base[1], base[2], 254})
	fail := func(err error) (*Net, error) {
		n.Close()
		return nil, err
	}
	if err := n.ip(ctx, "link", "add", "name", n.bridge, "type", "bridge",
		"nf_call_iptables", "0", "nf_call_ip6tables", "0", "nf_call_arptables", "0"); err != nil {
		return fail(err)
	}
	n.mu.Lock()
	n.hosts = []*Host{} // Close now knows the bridge exists
	n.mu.Unlock()
	if err := n.ip(ctx, "addr", "add", n.gateway.String()+"/24", "dev", n.bridge); err != nil {
		return fail(err)
	}
	if err := n.ip(ctx, "link", "set", n.bridge, "up"); err != nil {
		return fail(err)
	}
	for i, name := range hosts {
		h := &Host{net: n, name: name, ns: "et-" + id + "-" + name, veth: "etv-" + id + "-" + strconv.Itoa(i), index: i,
			ip: netip.AddrFrom4([4]byte{base[0], base[1], base[2], byte(i + 1)})}
		if err := n.ip(ctx, "netns", "add", h.ns); err != nil {
			return fail(err)
		}
		n.mu.Lock()
		n.hosts = append(n.hosts, h)
		n.mu.Unlock()
		steps := [][]string{
			{"link", "add", h.veth, "type", "veth", "peer", "name", "eth0", "netns", h.ns},
			{"link", "set", h.veth, "master", n.bridge},
			{"link", "set", h.veth, "up"},
			{"-n", h.ns, "addr", "add", h.ip.String() + "/24", "dev", "eth0"},
			{"-n", h.ns, "link", "set", "eth0", "up"},
			{"-n", h.ns, "link", "set", "lo", "up"},
		}
		for _, s := range steps {
			if err := n.ip(ctx, s...); err != nil {
				return fail(err)
			}
		}
	}
	return n, nil
}

func validName(s string) bool {
	if len(s) == 0 || len(s) > 20 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// freePrefix draws a /24 in 10.200.0.0/13..10.255.255.0 that no address of
// this namespace's interfaces falls in (a Net of another process, or a
// real network).
func freePrefix() (netip.Prefix, error) {
	var used []netip.Prefix
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				if p, err := netip.ParsePrefix(ipn.String()); err == nil {
					used = append(used, p.Masked())
				}
			}
		}
	}
	for range 200 {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(200 + rand.IntN(56)), byte(rand.IntN(256)), 0}), 24)
		clash := false
		for _, u := range used {
			if u.Overlaps(p) {
				clash = true
				break
			}
		}
		if !clash {
			return p, nil
		}
	}
	return netip.Prefix{}, errors.New("netns: no free /24 in 10.200.0.0-10.255.255.0")
}

// sweep removes the namespaces and links of processes that no longer run
// (a test binary killed before its cleanup).
func sweep(ctx context.Context) {
	dead := func(id string) bool {
		pid36, _, ok := strings.Cut(id, "-")
		if !ok {
			return false
		}
		pid, err := strconv.ParseInt(pid36, 36, 32)
		if err != nil || pid <= 0 {
			return false
		}
		if int(pid) == os.Getpid() {
			return false
		}
		return syscall.Kill(int(pid), 0) == syscall.ESRCH
	}
	if out, err := run(ctx, "ip", "netns", "list"); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 || !strings.HasPrefix(f[0], "et-") {
				continue
			}
			rest := strings.TrimPrefix(f[0], "et-")
			parts := strings.SplitN(rest, "-", 3)
			if len(parts) == 3 && dead(parts[0]+"-"+parts[1]) {
				killAll(ctx, f[0])
				run(ctx, "ip", "netns", "del", f[0])
			}
		}
	}
	if out, err := run(ctx, "ip", "-o", "link", "show"); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
			for _, pre := range []string{"etv-", "etb-"} {
				if rest, ok := strings.CutPrefix(name, pre); ok {
					parts := strings.SplitN(rest, "-", 3)
					if len(parts) >= 2 && dead(parts[0]+"-"+parts[1]) {
						run(ctx, "ip", "link", "del", name)
					}
				}
			}
		}
	}
}

// killAll SIGKILLs every process in namespace ns and waits (briefly) until
// none is left.
func killAll(ctx context.Context, ns string) {
	for attempt := 0; attempt < 50; attempt++ {
		out, err := run(ctx, "ip", "netns", "pids", ns)
		if err != nil {
			return
		}
		pids := strings.Fields(string(out))
		if len(pids) == 0 {
			return
		}
		for _, p := range pids {
			if pid, err := strconv.Atoi(p); err == nil && pid != os.Getpid() {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		t := time.NewTimer(20 * time.Millisecond) // a killed process leaves the namespace once reaped
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
	}
}

func run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return bytes.TrimSpace(out.Bytes()), err
}

func (n *Net) ip(ctx context.Context, args ...string) error {
	if out, err := run(ctx, "ip", args...); err != nil {
		return fmt.Errorf("netns: ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// Close stops every Forward, kills every process left in the hosts'
// namespaces, then deletes the namespaces (and with them the veths) and
// the bridge. Safe to call
// more than once; it returns the first failure but tries every step.
func (n *Net) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	hosts, made, forwards := n.hosts, n.hosts != nil, n.forwards
	n.mu.Unlock()
	n.endLife()
	for _, f := range forwards {
		f.close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var first error
	keep := func(err error) {
		if first == nil {
			first = err
		}
	}
	for _, h := range hosts {
		killAll(ctx, h.ns)
	}
	for _, h := range hosts {
		if err := n.ip(ctx, "netns", "del", h.ns); err != nil {
			keep(err)
		}
		// Deleting the namespace deletes eth0 and so its peer, soon after
		// (the kernel tears the namespace down in the background); a veth
		// made before its peer moved is removed here.
		// The kernel may remove it between the two steps: "Cannot find
		// device" when it was gone before the call, "No such device" when
		// it went during it.
		if out, err := run(ctx, "ip", "link", "del", h.veth); err != nil && !bytes.Contains(out, []byte("Cannot find device")) && !bytes.Contains(out, []byte("No such device")) {
			keep(fmt.Errorf("netns: ip link del %s: %v: %s", h.veth, err, out))
		}
	}
	if made {
		if err := n.ip(ctx, "link", "del", n.bridge); err != nil {
			keep(err)
		}
	}
	return first
}

// Gateway returns the caller's address on the bridge (.254), which every
// host reaches over its link: listen there to serve the hosts from the
// caller's namespace.
func (n *Net) Gateway() netip.Addr { return n.gateway }

// Prefix returns the Net's /24.
func (n *Net) Prefix() netip.Prefix { return n.prefix }

// Hosts returns the hosts in the order New was given them.
func (n *Net) Hosts() []*Host {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]*Host(nil), n.hosts...)
}

// Host returns the host named name, or nil.
func (n *Net) Host(name string) *Host {
	for _, h := range n.Hosts() {
		if h.name == name {
			return h
		}
	}
	return nil
}

// Name returns the host's name as given to New.
func (h *Host) Name() string { return h.name }

// Namespace returns the name of the host's network namespace (for `ip
// netns exec NAME ...`).
func (h *Host) Namespace() string { return h.ns }

// IP returns the host's address.
func (h *Host) IP() netip.Addr { return h.ip }

// Addr returns "IP:port" on this host.
func (h *Host) Addr(port int) string { return net.JoinHostPort(h.ip.String(), strconv.Itoa(port)) }

// Command returns a Cmd that runs name with args inside the host's
// namespace (ip netns exec), killed with SIGKILL when the calling process
// dies or the Net closes. ctx kills it as exec.CommandContext does.
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	ctx, cancel := context.WithCancel(ctx)
	context.AfterFunc(h.net.life, cancel)
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", h.ns, name}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// Run runs name with args inside the host's namespace and returns its
// combined output.
func (h *Host) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := h.Command(ctx, name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("netns: %s on host %s: %w: %s", name, h.name, err, bytes.TrimSpace(out.Bytes()))
	}
	return out.Bytes(), err
}

// Cap limits each direction of the host's link to bitsPerSecond (tc tbf on
// both ends of its veth; burst max(2 ms of the rate, 32 KiB), queue up to
// 50 ms). bitsPerSecond <= 0 removes the cap.
func (h *Host) Cap(ctx context.Context, bitsPerSecond int64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if bitsPerSecond <= 0 {
		if h.capped == 0 {
			return nil
		}
		_, e1 := run(ctx, "tc", "-n", h.ns, "qdisc", "del", "dev", "eth0", "root")
		_, e2 := run(ctx, "tc", "qdisc", "del", "dev", h.veth, "root")
		if err := errors.Join(e1, e2); err != nil {
			return fmt.Errorf("netns: uncap host %s: %w", h.name, err)
		}
		h.capped = 0
		return nil
	}
	burst := max(bitsPerSecond/8/500, 32<<10)
	tbf := []string{"root", "tbf", "rate", strconv.FormatInt(bitsPerSecond, 10) + "bit",
		"burst", strconv.FormatInt(burst, 10), "latency", "50ms"}
	if out, err := run(ctx, "tc", append([]string{"-n", h.ns, "qdisc", "replace", "dev", "eth0"}, tbf...)...); err != nil {
		return fmt.Errorf("netns: cap host %s: tc: %v: %s", h.name, err, out)
	}
	if out, err := run(ctx, "tc", append([]string{"qdisc", "replace", "dev", h.veth}, tbf...)...); err != nil {
		return fmt.Errorf("netns: cap host %s: tc: %v: %s", h.name, err, out)
	}
	h.capped = bitsPerSecond
	return nil
}

// Cut takes the host's link down at the bridge end: the host keeps its
// address and its processes run on, but no packet passes either way until
// Restore (no reset reaches anyone; peers see silence, as with a pulled
// cable or a partition).
func (h *Host) Cut(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.net.ip(ctx, "link", "set", h.veth, "down"); err != nil {
		return err
	}
	h.cut = true
	return nil
}

// Restore brings a cut link up again.
func (h *Host) Restore(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.net.ip(ctx, "link", "set", h.veth, "up"); err != nil {
		return err
	}
	h.cut = false
	return nil
}
