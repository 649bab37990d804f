package launcher

import (
	"fmt"
	"io"
	"strings"
	"sync"
)

// EnvNetns, in the launcher's environment, places the workers on hosts
// made of Linux network namespaces (tests of jobs spanning hosts, see
// internal/netns) when Spec.Wrap is not set: a comma-separated list of
// namespace names; worker i < len starts in the i-th (`ip netns exec`), and
// every later worker (a join) in the listed namespace with the fewest live
// workers, the first such in list order. The workers must then listen on
// their host's address (the examples' -listen 0.0.0.0:0). Unset or empty:
// the workers run in the launcher's own namespace.
const EnvNetns = "ELASTICTRAIN_LAUNCHER_NETNS"

// placement is the Spec.Wrap of EnvNetns. Safe for concurrent use.
type placement struct {
	mu     sync.Mutex
	spaces []string
	live   map[int]string // worker -> namespace, while its process runs
	log    io.Writer
}

// newPlacement parses EnvNetns' value; nil when it names no namespace.
func newPlacement(env string, log io.Writer) *placement {
	p := &placement{live: map[int]string{}, log: log}
	for _, ns := range strings.Split(env, ",") {
		if ns = strings.TrimSpace(ns); ns != "" {
			p.spaces = append(p.spaces, ns)
		}
	}
	if len(p.spaces) == 0 {
		return nil
	}
	return p
}

// wrap returns worker's command prefix and logs where it runs.
func (p *placement) wrap(worker int) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	ns := ""
	if worker < len(p.spaces) {
		ns = p.spaces[worker]
	} else {
		count := map[string]int{}
		for _, s := range p.live {
			count[s]++
		}
		ns = p.spaces[0]
		for _, s := range p.spaces {
			if count[s] < count[ns] {
				ns = s
			}
		}
	}
	p.live[worker] = ns
	fmt.Fprintf(p.log, "[launcher] worker %d runs in network namespace %s\n", worker, ns)
	return []string{"ip", "netns", "exec", ns}
}

// exited forgets worker's process.
func (p *placement) exited(worker int) {
	p.mu.Lock()
	delete(p.live, worker)
	p.mu.Unlock()
}
