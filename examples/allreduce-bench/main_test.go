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
