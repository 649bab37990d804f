package main

import (
	"slices"
	"testing"
)

func TestParseSizes(t *testing.T) {
	got, err := parseSizes("4K, 1M,64MiB,4096,1G,8KB")
	if err != nil {
		t.Fatal(err)
	}
	want := []int{4 << 10, 1 << 20, 64 << 20, 4096, 1 << 30, 8 << 10}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for _, bad := range []string{"", "x", "-4K", "6", "0"} {
		if _, err := parseSizes(bad); err == nil {
			t.Errorf("parseSizes(%q): no error", bad)
		}
	}
}

func TestParseHostsAndRate(t *testing.T) {
	if h, l, err := parseHosts("2x2"); err != nil || h != 2 || l != 2 {
		t.Fatalf("2x2: %d %d %v", h, l, err)
	}
	if h, l, err := parseHosts("4X1"); err != nil || h != 4 || l != 1 {
		t.Fatalf("4X1: %d %d %v", h, l, err)
	}
	for _, bad := range []string{"", "2", "x2", "2x", "0x3", "2x0", "axb", "100x1"} {
		if _, _, err := parseHosts(bad); err == nil {
			t.Errorf("parseHosts(%q): no error", bad)
		}
	}
	for in, want := range map[string]int64{"1gbit": 1e9, "500mbit": 5e8, "2.5Gbit": 2.5e9, "64kbit": 64e3, "0": 0, "1000bit": 1000} {
		if got, err := parseRate(in); err != nil || got != want {
			t.Errorf("parseRate(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "fast", "-1gbit"} {
		if _, err := parseRate(bad); err == nil {
			t.Errorf("parseRate(%q): no error", bad)
		}
	}
}

// The bound on busbw over links of rate B each way: B for the flat ring
// (2(n-1)/n of the buffer crosses each host link, as busbw counts), and
// B*h(n-1)/(n(h-1)) for the hierarchical allreduce (2(h-1)/h crosses it).
func TestBusBound(t *testing.T) {
	const B = 125e6
	cases := []struct {
		impl string
		n, h int
		want float64
	}{
		{"flat", 4, 4, B},
		{"gloo", 4, 2, B},
		{"striped", 4, 2, 1.5 * B},
		{"leaders", 4, 4, B},
		{"striped", 8, 2, B * 2 * 7 / 8},
		{"flat", 4, 1, 0}, // one host: no link to bound it
	}
	for _, tc := range cases {
		if got := busBound(tc.impl, tc.n, tc.h, B); got != tc.want {
			t.Errorf("busBound(%s, n=%d, h=%d) = %v, want %v", tc.impl, tc.n, tc.h, got, tc.want)
		}
	}
}
