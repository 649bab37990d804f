package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestAddrIsFreeAndBelowTheEphemeralRange(t *testing.T) {
	eph := ephemeralStart()
	for range 20 {
		addr, err := Addr()
		if err != nil {
			t.Fatal(err)
		}
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		port, _ := strconv.Atoi(p)
		if eph > low+100 && (port < low || port >= eph) {
			t.Fatalf("port %d outside [%d, %d)", port, low, eph)
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("%s is not free: %v", addr, err)
		}
		l.Close()
	}
}

// Draws never repeat a port within claimTTL, in this process or another:
// 500 draws from the ~12,000 ports below the ephemeral range would repeat
// one with a probability above 99.99 % without the claims.
func TestDrawsDoNotRepeatAPort(t *testing.T) {
	seen := map[string]bool{}
	for range 500 {
		addr, err := Addr()
		if err != nil {
			t.Fatal(err)
		}
		if seen[addr] {
			t.Fatalf("%s drawn twice", addr)
		}
		seen[addr] = true
	}
}
