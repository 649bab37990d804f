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
