package mnist

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/elastictrain/elastictrain/internal/netns"
)

// Hosts with their own addresses (-hosts HxL, -cap RATE): the launcher
// makes H hosts out of Linux network namespaces (internal/netns: one
// namespace per host with its own address, joined by veths to one bridge
// in the launcher's namespace), caps each host's link with tc tbf when
// -cap is set, and starts L workers on each, workers 0..L-1 on host h0,
// L..2L-1 on h1, and so on. Each worker listens on 0.0.0.0 and advertises
// its host's address, so the gradients cross the links between hosts. The
// store (embedded or -redis) stays in the launcher's namespace; the hosts
// reach it through a relay on the bridge (netns.Net.Forward), over their
// capped links like any other traffic. A worker started later (-join) goes
// to the host with the fewest live workers, the lowest-numbered such host
// (the launcher's placement, monitor.Spec.Netns). Everything made is
// removed when the run ends, on success, failure or Ctrl-C; what a
// SIGKILLed launcher leaves behind the next run removes (netns.New).

// hostFlags holds -hosts and -cap.
type hostFlags struct {
	arg     string // -hosts as given; "" = the workers run in this namespace
	capArg  string // -cap as given
	hosts   int    // H
	perHost int    // L
	capBits int64  // bits per second each way; 0 = none
}

const (
	hostsHelp = "run the workers on H hosts made of Linux network namespaces (root, iproute2), L per host: HxL, e.g. 4x1; " +
		"starts H*L workers (overriding -workers), each listening on its host's address; the store is reached from every host through the bridge. " +
		"A -join worker goes to the host with the fewest live workers (the lowest-numbered such host)"
	capHelp = "with -hosts: cap each host's link to this rate each way (tc tbf; suffixes kbit, mbit, gbit; 0 = none)"
)

func (h *hostFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&h.arg, "hosts", "", hostsHelp)
	fs.StringVar(&h.capArg, "cap", "0", capHelp)
}

// apply checks -hosts and -cap after parsing and, with -hosts, sets the
// worker count and the listen address: every check that needs no process
// to start, ending with whether this process can make namespaces. Errors
// name the flag.
func (h *hostFlags) apply(c *config, fs *flag.FlagSet) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if h.arg == "" {
		if set["cap"] {
			return errors.New("-cap needs -hosts: only the links between hosts are capped")
		}
		return nil
	}
	var err error
	if h.hosts, h.perHost, err = netns.ParseLayout(h.arg); err != nil {
		return fmt.Errorf("-hosts: %w", err)
	}
	if h.capBits, err = netns.ParseRate(h.capArg); err != nil {
		return fmt.Errorf("-cap: %w", err)
	}
	switch {
	case c.worker:
		return errors.New("-hosts belongs to the launcher: a -worker runs where it is started")
	case c.redisOpts.Master != "":
		return errors.New("-hosts with -redis-master: the hosts reach the launcher's namespace through one relay per address, and the Sentinels would name masters they cannot reach")
	case c.redisOpts.TLS || c.redisOpts.CAFile != "":
		return errors.New("-hosts with -redis-tls or -redis-ca: the hosts dial the store through a relay on the bridge, whose address the store's certificate does not name")
	}
	c.workers = h.hosts * h.perHost
	if c.workers > c.max {
		return fmt.Errorf("-hosts %s starts %d workers, above -max %d", h.arg, c.workers, c.max)
	}
	if !set["listen"] {
		c.listen = "0.0.0.0:0"
	} else {
		host, port, err := net.SplitHostPort(c.listen)
		if err != nil {
			return fmt.Errorf("-listen %q: want host:port: %w", c.listen, err)
		}
		if ip, err := netip.ParseAddr(host); host != "" && (err != nil || !ip.IsUnspecified()) {
			return fmt.Errorf("-listen %q with -hosts: want 0.0.0.0:PORT, so each worker listens on its own host's address", c.listen)
		}
		if p, err := strconv.Atoi(port); err == nil && p != 0 && h.perHost > 1 {
			return fmt.Errorf("-listen %q with -hosts %s: %d workers on a host cannot share port %d; use port 0", c.listen, h.arg, h.perHost, p)
		}
	}
	if err := netns.Available(); err != nil {
		return fmt.Errorf("-hosts: %w", err)
	}
	return nil
}

// capDesc is the result's "cap": -cap as given with -hosts, else "".
func (h *hostFlags) capDesc() string {
	if h.arg == "" {
		return ""
	}
	return h.capArg
}

// hostSet is the hosts of one run.
type hostSet struct {
	net    *netns.Net
	spaces []string // worker i's namespace, for i < H*L
	store  string   // the store's address as the hosts dial it
}

// startHosts makes the hosts of h (their links capped) and the relay to
// the store at storeAddr. The caller closes the result's net (also on
// error paths after a nil error) to remove everything.
func startHosts(ctx context.Context, h *hostFlags, storeAddr string, log io.Writer) (*hostSet, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	names := make([]string, h.hosts)
	for i := range names {
		names[i] = "h" + strconv.Itoa(i)
	}
	n, err := netns.New(ctx, names...)
	if err != nil {
		return nil, fmt.Errorf("-hosts: %w", err)
	}
	r := &hostSet{net: n}
	fail := func(err error) (*hostSet, error) {
		n.Close()
		return nil, err
	}
	for _, host := range n.Hosts() {
		if h.capBits > 0 {
			if err := host.Cap(ctx, h.capBits); err != nil {
				return fail(fmt.Errorf("-cap: %w", err))
			}
		}
		for range h.perHost {
			r.spaces = append(r.spaces, host.Namespace())
		}
	}
	if r.store, err = n.Forward(storeAddr); err != nil {
		return fail(err)
	}
	capped := "uncapped links"
	if h.capBits > 0 {
		capped = "links capped at " + h.capArg + " each way (tc tbf)"
	}
	fmt.Fprintf(log, "[launcher] %d hosts x %d workers on network namespaces in %s, %s; the hosts reach the store at %s\n",
		h.hosts, h.perHost, n.Prefix(), capped, r.store)
	return r, nil
}
