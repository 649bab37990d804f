package launch

import (
	"errors"
	"fmt"
	"os"
	"strings"
	gosync "sync"
)

// EnvNetns, in a launcher's own environment, asks it to place its workers
// on hosts made of Linux network namespaces (tests of jobs spanning hosts):
// a comma-separated list of namespace names, read by ParseNetns. Package
// launch itself does not read it; launch/monitor and the examples do.
const EnvNetns = "ELASTICTRAIN_LAUNCHER_NETNS"

// ErrNoNamespace is NewNetns' error for a list that names no namespace.
var ErrNoNamespace = errors.New("launch: no network namespace named")

// Netns places worker processes in Linux network namespaces, one host
// each: worker i < len(spaces) starts in the i-th, and every later worker
// (one Job.Add started) in the namespace with the fewest live workers,
// the first such in list order. Use Wrap as Spec.Wrap (it runs the
// worker under `ip netns exec NS`, which needs the privileges to enter
// the namespace) and call Exited from Hooks.OnExit, so a worker that left
// frees its place. The workers must listen on their host's address
// (0.0.0.0), not loopback. Safe for concurrent use.
type Netns struct {
	mu     gosync.Mutex
	spaces []string
	live   map[int]string // worker -> namespace, while its process runs
}

// NewNetns returns the placement over spaces (names as `ip netns` lists
// them, in order). Errors: ErrNoNamespace when spaces holds no name; a
// name holding a slash or a blank.
func NewNetns(spaces []string) (*Netns, error) {
	n := &Netns{live: map[int]string{}}
	for _, ns := range spaces {
		if ns = strings.TrimSpace(ns); ns == "" {
			continue
		}
		if strings.ContainsAny(ns, "/ \t\n") {
			return nil, fmt.Errorf("launch: %q is not a network namespace name", ns)
		}
		n.spaces = append(n.spaces, ns)
	}
	if len(n.spaces) == 0 {
		return nil, ErrNoNamespace
	}
	return n, nil
}

// ParseNetns returns the placement that the comma-separated list env
// (EnvNetns' form) names, or nil when it names none.
func ParseNetns(env string) (*Netns, error) {
	n, err := NewNetns(strings.Split(env, ","))
	if errors.Is(err, ErrNoNamespace) {
		return nil, nil
	}
	return n, err
}

// NetnsFromEnv is ParseNetns of this process's EnvNetns.
func NetnsFromEnv() (*Netns, error) { return ParseNetns(os.Getenv(EnvNetns)) }

// Spaces returns the namespaces in list order.
func (n *Netns) Spaces() []string { return append([]string(nil), n.spaces...) }

// Place picks the namespace of worker's process now starting and counts it
// there until Exited.
func (n *Netns) Place(worker int) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if worker >= 0 && worker < len(n.spaces) {
		n.live[worker] = n.spaces[worker]
		return n.spaces[worker]
	}
	count := map[string]int{}
	for _, s := range n.live {
		count[s]++
	}
	ns := n.spaces[0]
	for _, s := range n.spaces {
		if count[s] < count[ns] {
			ns = s
		}
	}
	n.live[worker] = ns
	return ns
}

// Wrap is Spec.Wrap: worker's command prefix, `ip netns exec NS`, with NS
// from Place.
func (n *Netns) Wrap(worker int) []string {
	return []string{"ip", "netns", "exec", n.Place(worker)}
}

// Exited forgets x's worker: call it from Hooks.OnExit.
func (n *Netns) Exited(x Exit) {
	n.mu.Lock()
	delete(n.live, x.Worker)
	n.mu.Unlock()
}
