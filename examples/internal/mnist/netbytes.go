package mnist

import (
	"os"
	"strconv"
	"strings"
)

// netBytesSent returns the bytes this process's network namespace sent
// over its interfaces other than loopback (/proc/self/net/dev), or 0 when
// they cannot be read (not Linux). Under -hosts each worker has a
// namespace, so this is what its host sent: the collectives, and its share
// of the store's traffic.
func netBytesSent() int64 {
	b, err := os.ReadFile("/proc/self/net/dev")
	if err != nil {
		return 0
	}
	var sum int64
	for _, line := range strings.Split(string(b), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(name) == "lo" {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 9 {
			continue // the header
		}
		if n, err := strconv.ParseInt(f[8], 10, 64); err == nil {
			sum += n
		}
	}
	return sum
}
