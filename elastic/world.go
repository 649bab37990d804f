package elastic

import "github.com/elastictrain/elastictrain/elastic/store"

// Member is one worker process as the rendezvous knows it (store.Member,
// where its fields are described): ID is the identity, random per process
// start (NewMember), never the host name; Addr is the peer address
// ("host:port") handed to peers in World.Members; Endpoints holds every
// other address a round needs of this worker, by name.
type Member = store.Member

// MaxMemberFieldLen bounds Member.ID and Member.Host (bytes); Addr may be
// up to 4 times longer.
const MaxMemberFieldLen = store.MaxMemberFieldLen

// MaxEndpoints bounds Member.Endpoints.
const MaxEndpoints = store.MaxEndpoints

// NewMember returns a Member with a fresh random ID (128 bits, 32 hex
// digits), this host's name, this process's PID and the given peer address.
func NewMember(addr string) Member { return store.NewMember(addr) }

// World is one member's view of a closed round: the job, the round number
// (only ever grows within a job), this member's rank, the world size, and all
// members in rank order (len(Members) == Size, Members[Rank] is this member).
// A World is a plain value, safe to copy and share.
type World struct {
	JobID string
	Round uint64
	Rank  int
	Size  int
	// Members in rank order; len == Size. The slice may be shared with
	// the other Agents of this process that are in the same round (one
	// roster per process, not one per member): read it, copy it before
	// changing it.
	Members []Member
}

// Addrs returns the members' peer addresses in rank order (len == Size).
func (w World) Addrs() []string {
	out := make([]string, len(w.Members))
	for i, m := range w.Members {
		out[i] = m.Addr
	}
	return out
}

// Endpoints returns every member's address for the endpoint name (see
// Member.Endpoint) in rank order (len == Size).
func (w World) Endpoints(name string) []string {
	out := make([]string, len(w.Members))
	for i, m := range w.Members {
		out[i] = m.Endpoint(name)
	}
	return out
}

// MemberIDs returns the members' IDs in rank order (len == Size).
func (w World) MemberIDs() []string {
	out := make([]string, len(w.Members))
	for i, m := range w.Members {
		out[i] = m.ID
	}
	return out
}
