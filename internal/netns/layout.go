package netns

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxLayoutHosts and MaxLayoutProcs bound what ParseLayout accepts: at
// most 64 hosts and 256 processes (H x L) in all.
const (
	MaxLayoutHosts = 64
	MaxLayoutProcs = 256
)

// ParseLayout parses "HxL" (H hosts of L processes each, e.g. "2x2"; the x
// may be upper case) as the -hosts flags of the examples take it. Errors:
// anything else, H or L below 1, H above MaxLayoutHosts or H x L above
// MaxLayoutProcs.
func ParseLayout(s string) (hosts, perHost int, err error) {
	h, l, ok := strings.Cut(strings.ToLower(strings.TrimSpace(s)), "x")
	hosts, err1 := strconv.Atoi(h)
	perHost, err2 := strconv.Atoi(l)
	// perHost is bounded before the product, which could overflow.
	if !ok || err1 != nil || err2 != nil || hosts < 1 || perHost < 1 || hosts > MaxLayoutHosts || perHost > MaxLayoutProcs ||
		hosts*perHost > MaxLayoutProcs {
		return 0, 0, fmt.Errorf("netns: layout %q: want HxL, H hosts (1..%d) of L processes each, at most %d in all (e.g. 2x2)",
			s, MaxLayoutHosts, MaxLayoutProcs)
	}
	return hosts, perHost, nil
}

// ParseRate parses a link rate as Host.Cap takes it, in bits per second:
// a non-negative number with an optional suffix bit, kbit (10^3), mbit
// (10^6) or gbit (10^9), in any case: "1gbit", "100mbit", "2.5gbit",
// "0" (no cap). Errors: anything else, a negative or non-finite number,
// or a rate that rounds to more than 0 but less than 1 bit per second.
func ParseRate(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := 1.0
	for _, suf := range []struct {
		s string
		m float64
	}{{"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}, {"bit", 1}} {
		if strings.HasSuffix(t, suf.s) {
			t, mult = strings.TrimSuffix(t, suf.s), suf.m
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	bits := f * mult
	if err != nil || !(bits >= 0) || bits > 1e15 || (bits > 0 && bits < 1) {
		return 0, fmt.Errorf("netns: rate %q: want a rate such as 100mbit or 1gbit (suffixes kbit, mbit, gbit; 0 = none)", s)
	}
	return int64(bits), nil
}
