//go:build !unix

package mnist

import "time"

// cpuTime returns 0 where getrusage is missing; BenchmarkStep then
// reports no CPU time.
func cpuTime() time.Duration { return 0 }
