package sync

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

// connectResult is one rank's outcome of a round in which some members hold
// another secret.
type connectResult struct {
	rank int
	err  error
}

// dials reports whether rank dials peer in a round of n (the lower rank
// dials the control and mesh connections, every rank its right neighbour's
// lanes).
func dials(rank, peer, n int) bool { return rank < peer || (rank+1)%n == peer }

// connectMixed connects one round of len(secretOf) transports on loopback,
// rank r holding secret secretOf[r] (0: the job's). It returns the results
// of the ranks that settle on their own (those that dial a member of
// another secret), then cancels the others and returns theirs too.
func connectMixed(t *testing.T, secretOf []int) map[int]error {
	t.Helper()
	base := testConfig(t)
	base.DialTimeout = 20 * time.Second // far beyond what settling takes
	n := len(secretOf)
	ts := make([]*Transport, n)
	addrs := make([]string, n)
	for r := range n {
		cfg := base
		if secretOf[r] != 0 {
			cfg.Secret = []byte(fmt.Sprintf("another secret %d, of 32 bytes...", secretOf[r]))
		}
		ts[r] = listenOne(t, cfg)
		addrs[r] = ts[r].Addr()
	}
	settles := map[int]bool{}
	for r := range n {
		for p := range n {
			if p != r && secretOf[p] != secretOf[r] && dials(r, p, n) {
				settles[r] = true
			}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := make(chan connectResult, n)
	for r := range n {
		go func() {
			ring, err := ts[r].Connect(ctx, World{Round: 1, Rank: r, Addrs: addrs})
			if ring != nil {
				ring.Close()
				err = errors.New("a round with a stranger formed")
			}
			out <- connectResult{r, err}
		}()
	}
	got := map[int]error{}
	settled := 0
	for len(got) < n {
		if settled == len(settles) {
			cancel() // the rest wait for connections that never come
		}
		res := <-out
		got[res.rank] = res.err
		if settles[res.rank] {
			settled++
		}
	}
	return got
}

func ranksWith(secretOf []int, secret int, but int) []int {
	var rs []int
	for r, s := range secretOf {
		if s == secret && r != but {
			rs = append(rs, r)
		}
	}
	return rs
}

// Must-show 1 (sync side): three members with the job secret and one
// without, whatever its rank. The honest ranks that dial the stranger learn
// that their group is the round's majority and name the stranger alone;
// the stranger learns that nobody proved the secret to it. No honest rank
// ever names another honest one.
func TestAuthErrorNamesTheStrangerToTheMajority(t *testing.T) {
	for s := range 4 {
		t.Run(fmt.Sprintf("stranger at rank %d", s), func(t *testing.T) {
			secretOf := make([]int, 4)
			secretOf[s] = 1
			got := connectMixed(t, secretOf)
			checkGroups(t, secretOf, got)
			var ae *AuthError
			if !errors.As(got[s], &ae) {
				t.Fatalf("stranger: %v, want an *AuthError", got[s])
			}
			if len(ae.Proved) != 0 || len(ae.Failed) == 0 || ae.Majority() {
				t.Errorf("stranger: %+v, want nobody proved, some failed, no majority", ae)
			}
			// The first honest rank to give up on the round has the
			// full picture; one that gives up later may instead learn
			// that a peer gave up first (ErrRoundMismatch).
			majorities := 0
			for r := range 4 {
				if r == s || !errors.As(got[r], &ae) {
					continue
				}
				majorities++
				if !ae.Majority() || !slices.Equal(ae.Failed, []int{s}) || !slices.Equal(ae.Proved, ranksWith(secretOf, 0, r)) {
					t.Errorf("rank %d: %v, want an *AuthError with a majority naming rank %d only", r, got[r], s)
				}
				if !errors.Is(got[r], ErrAuth) {
					t.Errorf("rank %d: %v does not wrap ErrAuth", r, got[r])
				}
				var pe *PeerError
				if !errors.As(got[r], &pe) || pe.Rank != s {
					t.Errorf("rank %d: %v, want a PeerError naming rank %d", r, got[r], s)
				}
			}
			if majorities == 0 {
				t.Errorf("no honest rank named the stranger: %v", got)
			}
		})
	}
}

// Strangers that share a wrong secret authenticate one another but are a
// minority: none of them can claim the round, while the honest majority
// still can. In a round of two (one honest member, one stranger) nobody
// has a majority.
func TestAuthMinorityNeverHasTheMajority(t *testing.T) {
	for _, secretOf := range [][]int{
		{0, 1, 0, 1, 0},
		{1, 1, 0, 0, 0},
		{0, 0, 0, 1, 1},
		{0, 1},
		{1, 0},
		{0, 0, 1, 1}, // a tie: two groups of two
	} {
		t.Run(fmt.Sprint(secretOf), func(t *testing.T) {
			got := connectMixed(t, secretOf)
			checkGroups(t, secretOf, got)
			n := len(secretOf)
			honest := len(ranksWith(secretOf, 0, -1))
			majorities := 0
			for r, s := range secretOf {
				var ae *AuthError
				if !errors.As(got[r], &ae) || !ae.Majority() {
					continue
				}
				majorities++
				if 2*honest <= n || s != 0 {
					t.Errorf("rank %d (secret %d) claims a majority: %+v", r, s, ae)
				}
			}
			if 2*honest > n && majorities == 0 {
				t.Errorf("no honest rank learnt that it holds the majority: %v", got)
			}
		})
	}
}

// checkGroups holds for every result: a rank only ever counts members of
// its own secret as proved, and members of another secret as failed.
func checkGroups(t *testing.T, secretOf []int, got map[int]error) {
	t.Helper()
	for r, err := range got {
		var ae *AuthError
		if !errors.As(err, &ae) {
			// A rank that dials nobody of another secret waits for
			// connections that never come (cancelled here; in a job,
			// the rendezvous moves on), or learns that a peer gave up.
			if !errors.Is(err, context.Canceled) && !errors.Is(err, ErrRoundMismatch) && !errors.Is(err, ErrPeerLost) {
				t.Errorf("rank %d: %v, want an *AuthError, a cancelled Connect or a peer that gave up", r, err)
			}
			continue
		}
		if ae.Round != 1 || ae.Rank != r || ae.Size != len(secretOf) {
			t.Errorf("rank %d: %+v names the wrong round, rank or size", r, ae)
		}
		for _, p := range ae.Proved {
			if secretOf[p] != secretOf[r] {
				t.Errorf("rank %d: rank %d of another secret proved it: %v", r, p, err)
			}
		}
		for _, p := range ae.Failed {
			if secretOf[p] == secretOf[r] {
				t.Errorf("rank %d: rank %d of the same secret failed: %v", r, p, err)
			}
		}
	}
}
