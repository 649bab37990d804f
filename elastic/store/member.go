package store

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
)

// MaxMemberFieldLen bounds Member.ID and Member.Host (bytes); Addr may be
// up to 4 times longer.
const MaxMemberFieldLen = 256

// Member is one worker process as the rendezvous knows it. ID is the
// identity: random per process start (NewMember), never the host name, so two
// processes on one host, or a restarted process, are different members. Host
// and PID are for humans and logs; Addr is the peer address ("host:port") the
// worker listens on for collectives, handed to peers in World.Members.
// Endpoints holds every other address a round needs of this worker, by
// name (a parameter server's, for example: driver.Partition.Name), so no
// two addresses are ever packed into one string; at most MaxEndpoints, each
// name and address within the same bounds as Host and Addr.
type Member struct {
	ID        string            `json:"id"`
	Host      string            `json:"host"`
	PID       int               `json:"pid"`
	Addr      string            `json:"addr"`
	Endpoints map[string]string `json:"ep,omitempty"`
}

// MaxEndpoints bounds Member.Endpoints.
const MaxEndpoints = 16

// MaxJobIDLen is the longest accepted job ID, in bytes.
const MaxJobIDLen = 128

// ValidateJobID checks a job ID: 1..MaxJobIDLen bytes of printable ASCII
// without '{', '}' (they would break the Redis hash tag) or spaces. Every
// call of the Redis store checks its job ID with it.
func ValidateJobID(id string) error {
	if id == "" {
		return errors.New("empty JobID")
	}
	if len(id) > MaxJobIDLen {
		return fmt.Errorf("JobID longer than %d bytes", MaxJobIDLen)
	}
	if i := strings.IndexFunc(id, func(r rune) bool { return r <= ' ' || r > '~' || r == '{' || r == '}' }); i >= 0 {
		return fmt.Errorf("JobID %q has a forbidden character at byte %d", id, i)
	}
	return nil
}

// Endpoint returns the member's address for name: Endpoints[name], or
// Addr when name is "" or "sync" and no such entry exists.
func (m Member) Endpoint(name string) string {
	if a, ok := m.Endpoints[name]; ok {
		return a
	}
	if name == "" || name == "sync" {
		return m.Addr
	}
	return ""
}

// NewMember returns a Member with a fresh random ID (128 bits, 32 hex
// digits), this host's name, this process's PID and the given peer address.
func NewMember(addr string) Member {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		// crypto/rand.Read does not fail on supported platforms (Go 1.24+).
		panic("elastic: crypto/rand failed: " + err.Error())
	}
	host, _ := os.Hostname()
	return Member{ID: hex.EncodeToString(b[:]), Host: host, PID: os.Getpid(), Addr: addr}
}

// Validate reports whether m may be stored: a non-empty ID of printable
// ASCII without spaces, ID and Host at most MaxMemberFieldLen bytes, Addr
// at most 4 times that, at most MaxEndpoints endpoints within the same
// bounds. elastic.NewAgent and the Redis store's Join check it.
func (m Member) Validate() error {
	switch {
	case m.ID == "":
		return errors.New("elastic: member ID is empty")
	case len(m.ID) > MaxMemberFieldLen || len(m.Host) > MaxMemberFieldLen || len(m.Addr) > 4*MaxMemberFieldLen:
		return errors.New("elastic: member field too long")
	case len(m.Endpoints) > MaxEndpoints:
		return fmt.Errorf("elastic: member has %d endpoints, at most %d", len(m.Endpoints), MaxEndpoints)
	}
	for name, addr := range m.Endpoints {
		if name == "" || len(name) > MaxMemberFieldLen || len(addr) > 4*MaxMemberFieldLen {
			return fmt.Errorf("elastic: member endpoint %q: name empty or too long, or address too long", name)
		}
	}
	for _, r := range m.ID {
		if r <= ' ' || r > '~' {
			return fmt.Errorf("elastic: member ID %q: only printable ASCII without spaces", m.ID)
		}
	}
	return nil
}

func (m Member) record() string {
	b, _ := json.Marshal(m) // cannot fail: strings and an int
	return string(b)
}

func parseRecord(s string) (Member, error) {
	var m Member
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return Member{}, fmt.Errorf("%w: member record: %v", ErrBadState, err)
	}
	if m.ID == "" {
		return Member{}, fmt.Errorf("%w: member record without ID", ErrBadState)
	}
	return m, nil
}

// rosterCache holds the last roster (member records in rank order, one per
// line) parsed in this process. Every member of a round receives the same
// roster; when many members are goroutines of one process (tests, the
// rendezvous bench, single-host jobs) it is parsed once instead of once per
// member, which at a thousand members is a million JSON decodes. The lock is
// held while parsing, so members that receive a new roster together wait for
// one parse instead of each doing it.
var rosterCache struct {
	mu      sync.Mutex
	roster  string
	members []Member
}

// parseRoster parses a roster: records joined by "\n" (JSON of Member never
// holds a raw newline). It returns a copy the caller owns (Endpoints maps
// included), or ErrBadState if a record is malformed or an ID is there twice.
func parseRoster(roster string) ([]Member, error) {
	rosterCache.mu.Lock()
	defer rosterCache.mu.Unlock()
	if rosterCache.members == nil || rosterCache.roster != roster {
		recs := strings.Split(roster, "\n")
		ms := make([]Member, len(recs))
		seen := make(map[string]struct{}, len(recs))
		for i, rec := range recs {
			m, err := parseRecord(rec)
			if err != nil {
				return nil, err
			}
			if _, dup := seen[m.ID]; dup {
				return nil, fmt.Errorf("%w: roster names member %q twice", ErrBadState, m.ID)
			}
			seen[m.ID] = struct{}{}
			ms[i] = m
		}
		rosterCache.roster, rosterCache.members = roster, ms
	}
	out := slices.Clone(rosterCache.members)
	for i := range out {
		out[i].Endpoints = maps.Clone(out[i].Endpoints)
	}
	return out, nil
}
